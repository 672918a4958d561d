//! A small certificate authority: a cluster CA and the certificates it signs (brokers, Kafka
//! listeners, clients). `kiln certs` uses it, and so do the tests. A site with its own PKI
//! issues the same certificates with its own tools: a broker certificate needs only the DNS
//! name [`node_name`] among its subject alternative names (docs/security.md).
//!
//! [`Ca::load`] reads back a CA this module made (its subject is one CN, which is how a child's
//! issuer name is rebuilt byte for byte); it refuses any other.

use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;
use time::OffsetDateTime;

use crate::identity::node_name;
use crate::TlsError;

/// How long a certificate is valid: from a day before it was issued (clocks differ) for
/// `days`, unless `expired` makes one whose validity ended yesterday (for tests of refusal).
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    pub days: u32,
    pub expired: bool,
}

impl Default for Validity {
    fn default() -> Self {
        // Rotation once a year is the documented routine; two years leaves slack.
        Self {
            days: 730,
            expired: false,
        }
    }
}

/// A certificate and its key, as PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    der: CertificateDer<'static>,
}

impl Issued {
    pub fn der(&self) -> CertificateDer<'static> {
        self.der.clone()
    }

    /// Writes `<dir>/<stem>.crt` and `<dir>/<stem>.key` (the key readable by its owner only).
    pub fn write(&self, dir: &Path, stem: &str) -> Result<(), TlsError> {
        write_file(&dir.join(format!("{stem}.crt")), &self.cert_pem, false)?;
        write_file(&dir.join(format!("{stem}.key")), &self.key_pem, true)
    }
}

fn write_file(path: &Path, text: &str, secret: bool) -> Result<(), TlsError> {
    let fail = |e: std::io::Error| TlsError::Read {
        path: path.display().to_string(),
        error: format!("writing: {e}"),
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    use std::io::Write;
    let mut file = options.open(path).map_err(fail)?;
    file.write_all(text.as_bytes()).map_err(fail)?;
    file.sync_all().map_err(fail)
}

pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's own certificate, which every party trusts.
    pub cert_pem: String,
    key_pem: String,
}

fn issue_error(e: impl std::fmt::Display) -> TlsError {
    TlsError::Issue(e.to_string())
}

fn ca_params(name: &str) -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(issue_error)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, DnValue::Utf8String(name.to_string()));
    Ok(params)
}

impl Ca {
    /// A new CA named `name` (its subject's CN), valid for ten years.
    pub fn generate(name: &str) -> Result<Ca, TlsError> {
        let key = KeyPair::generate().map_err(issue_error)?;
        let mut params = ca_params(name)?;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::from_secs(86_400);
        params.not_after = now + Duration::from_secs(3_650 * 86_400);
        let cert = params.self_signed(&key).map_err(issue_error)?;
        let key_pem = key.serialize_pem();
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// A CA this module made, from its certificate and key files.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Ca, TlsError> {
        let cert_pem = std::fs::read_to_string(cert_file).map_err(|e| TlsError::Read {
            path: cert_file.display().to_string(),
            error: e.to_string(),
        })?;
        let key_pem = std::fs::read_to_string(key_file).map_err(|e| TlsError::Read {
            path: key_file.display().to_string(),
            error: e.to_string(),
        })?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| TlsError::Invalid {
            path: key_file.display().to_string(),
            error: format!("not a private key: {e}"),
        })?;
        let der = crate::pem::load_cert_chain(cert_file)?
            .into_iter()
            .next()
            .ok_or_else(|| TlsError::Empty {
                path: cert_file.display().to_string(),
                what: "certificate",
            })?;
        let subject = crate::identity::subject_dn(&der)?;
        let Some(name) = subject.strip_prefix("CN=").filter(|n| !n.contains('=')) else {
            return Err(TlsError::Invalid {
                path: cert_file.display().to_string(),
                error: format!(
                    "subject {subject:?} is not one CN: only a CA made by `kiln certs ca` can be loaded; issue with your own tools otherwise (docs/security.md)"
                ),
            });
        };
        let params = ca_params(name)?;
        Ok(Ca {
            issuer: Issuer::new(params, key),
            cert_pem,
            key_pem,
        })
    }

    /// Writes `<dir>/ca.crt` and `<dir>/ca.key`.
    pub fn write(&self, dir: &Path) -> Result<(), TlsError> {
        write_file(&dir.join("ca.crt"), &self.cert_pem, false)?;
        write_file(&dir.join("ca.key"), &self.key_pem, true)
    }

    /// A certificate for subject `CN=<common_name>,O=Kiln` with `names` (DNS names or IP
    /// addresses) as its subject alternative names, for both server and client use.
    pub fn issue(
        &self,
        common_name: &str,
        names: &[String],
        validity: Validity,
    ) -> Result<Issued, TlsError> {
        let key = KeyPair::generate().map_err(issue_error)?;
        let mut params = CertificateParams::new(names.to_vec()).map_err(issue_error)?;
        // Written in this order, read last first: `CN=<common_name>,O=Kiln` (a fresh name:
        // rcgen's default holds a CN of its own).
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, DnValue::Utf8String("Kiln".into()));
        params.distinguished_name.push(
            DnType::CommonName,
            DnValue::Utf8String(common_name.to_string()),
        );
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        let day = Duration::from_secs(86_400);
        if validity.expired {
            params.not_before = now - 30 * day;
            params.not_after = now - day;
        } else {
            params.not_before = now - day;
            params.not_after = now + u32::max(validity.days, 1) * day;
        }
        let cert = params.signed_by(&key, &self.issuer).map_err(issue_error)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        })
    }

    /// A broker's certificate for node `id`: [`node_name`] for the Raft transport, plus
    /// `hosts` for its Kafka listener.
    pub fn issue_broker(&self, id: u64, hosts: &[String]) -> Result<Issued, TlsError> {
        let mut names = vec![node_name(id)];
        names.extend(hosts.iter().cloned());
        self.issue(&node_name(id), &names, Validity::default())
    }

    /// [`Ca::issue_broker`] with no Kafka host names.
    pub fn issue_node(&self, id: u64) -> Result<Issued, TlsError> {
        self.issue_broker(id, &[])
    }

    /// A client certificate whose principal is `User:CN=<name>,O=Kiln`.
    pub fn issue_client(&self, name: &str) -> Result<Issued, TlsError> {
        self.issue(name, &[], Validity::default())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_written_ca_loads_back_and_signs_certificates_its_certificate_verifies() {
        let dir = tempfile::tempdir().unwrap();
        Ca::generate("site CA").unwrap().write(dir.path()).unwrap();
        let ca = Ca::load(&dir.path().join("ca.crt"), &dir.path().join("ca.key")).unwrap();
        let node = ca.issue_node(3).unwrap();
        node.write(dir.path(), "node-3").unwrap();
        // The reloaded CA's certificate and the new leaf form a chain rustls accepts.
        let roots = crate::load_roots(&dir.path().join("ca.crt")).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            crate::provider(),
        )
        .build()
        .unwrap();
        let name = rustls::pki_types::ServerName::try_from(node_name(3)).unwrap();
        use rustls::client::danger::ServerCertVerifier;
        verifier
            .verify_server_cert(
                &node.der(),
                &[],
                &name,
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("node-3.key"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
