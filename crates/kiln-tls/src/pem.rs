//! PEM files in, DER values out.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

use crate::TlsError;

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        path: path.display().to_string(),
        error: e.to_string(),
    })
}

/// Every certificate in `path`, leaf first as the file has them. A file with none is an error.
pub fn load_cert_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Invalid {
            path: path.display().to_string(),
            error: format!("not a PEM certificate file: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            path: path.display().to_string(),
            what: "certificate (expected -----BEGIN CERTIFICATE-----)",
        });
    }
    Ok(certs)
}

/// The first private key in `path` (PKCS#8, PKCS#1 or SEC1).
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            path: path.display().to_string(),
            what: "private key (expected -----BEGIN PRIVATE KEY-----)",
        },
        e => TlsError::Invalid {
            path: path.display().to_string(),
            error: format!("not a PEM private key: {e}"),
        },
    })
}

/// The CA certificates in `path`, as trust anchors.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_cert_chain(path)? {
        roots.add(cert).map_err(|e| TlsError::Invalid {
            path: path.display().to_string(),
            error: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_bad_file_is_named_with_what_it_lacks() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = load_cert_chain(&missing).unwrap_err().to_string();
        assert!(err.contains("missing.pem"), "{err}");

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "nothing here\n").unwrap();
        let err = load_cert_chain(&empty).unwrap_err().to_string();
        assert!(err.contains("empty.pem holds no certificate"), "{err}");
        let err = load_private_key(&empty).unwrap_err().to_string();
        assert!(err.contains("empty.pem holds no private key"), "{err}");

        let torn = dir.path().join("torn.pem");
        std::fs::write(
            &torn,
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = load_cert_chain(&torn).unwrap_err().to_string();
        assert!(err.contains("torn.pem"), "{err}");
    }
}
