//! Who a certificate names.
//!
//! Brokers: the DNS name `kiln-node-<id>` among a certificate's subject alternative names. A
//! broker's Raft client asks for that name when it connects to node `id` (so the CA's signature
//! proves it reached `id`), and its Raft listener reads it from the client's certificate (so a
//! request's sender is known, not claimed).
//!
//! Clients: the certificate's subject as an RFC 2253 distinguished name, last RDN first, as
//! Java's `X500Principal.getName()` writes it (`CN=agent-1,OU=burnin,O=Example`), which is
//! the principal Kafka gives a TLS client (`User:CN=agent-1,...`).

use rustls::pki_types::CertificateDer;

use crate::TlsError;

/// What every broker certificate's node name starts with.
pub const NODE_NAME_PREFIX: &str = "kiln-node-";

/// The DNS name a broker's certificate carries for node `id`.
pub fn node_name(id: u64) -> String {
    format!("{NODE_NAME_PREFIX}{id}")
}

/// The node id a broker certificate names, if it names exactly one. A certificate naming two
/// nodes is refused (`None`): one certificate per broker.
pub fn node_of(cert: &CertificateDer<'_>) -> Option<u64> {
    let cert = webpki::EndEntityCert::try_from(cert).ok()?;
    let mut ids = cert.valid_dns_names().filter_map(|name| {
        let digits = name.strip_prefix(NODE_NAME_PREFIX)?;
        // Canonical decimal only: "kiln-node-01" is not node 1.
        if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
            return None;
        }
        digits.parse::<u64>().ok()
    });
    let first = ids.next()?;
    match ids.next() {
        None => Some(first),
        Some(_) => None,
    }
}

/// `User:<subject>`: the principal of a client that presented `cert`.
pub fn principal_of(cert: &CertificateDer<'_>) -> Result<String, TlsError> {
    Ok(format!("User:{}", subject_dn(cert)?))
}

/// The subject of `cert` in RFC 2253 form. An empty subject is `""`.
pub fn subject_dn(cert: &CertificateDer<'_>) -> Result<String, TlsError> {
    let parsed = webpki::EndEntityCert::try_from(cert).map_err(|e| TlsError::Invalid {
        path: "(peer certificate)".into(),
        error: e.to_string(),
    })?;
    let bad = |what: &str| TlsError::Invalid {
        path: "(peer certificate)".into(),
        error: format!("subject: {what}"),
    };
    let mut rdns = Vec::new();
    let mut name = Der(parsed.subject());
    while !name.0.is_empty() {
        let mut set = Der(name.take(TAG_SET).ok_or_else(|| bad("expected a SET"))?);
        let mut parts = Vec::new();
        while !set.0.is_empty() {
            let mut pair = Der(set
                .take(TAG_SEQUENCE)
                .ok_or_else(|| bad("expected a SEQUENCE"))?);
            let oid = pair.take(TAG_OID).ok_or_else(|| bad("expected an OID"))?;
            let (tag, value) = pair.any().ok_or_else(|| bad("expected a value"))?;
            parts.push(attribute(oid, tag, value));
        }
        rdns.push(parts.join("+"));
    }
    rdns.reverse();
    Ok(rdns.join(","))
}

const TAG_SET: u8 = 0x31;
const TAG_SEQUENCE: u8 = 0x30;
const TAG_OID: u8 = 0x06;

/// One `type=value`: a known type by its short name and a string value escaped, anything else
/// as `dotted.oid=#hex` (RFC 2253, 2.4), so no subject is ever misread.
fn attribute(oid: &[u8], tag: u8, value: &[u8]) -> String {
    const NAMES: [(&[u8], &str); 8] = [
        (&[0x55, 0x04, 0x03], "CN"),
        (&[0x55, 0x04, 0x06], "C"),
        (&[0x55, 0x04, 0x07], "L"),
        (&[0x55, 0x04, 0x08], "ST"),
        (&[0x55, 0x04, 0x0a], "O"),
        (&[0x55, 0x04, 0x0b], "OU"),
        (&[0x55, 0x04, 0x09], "STREET"),
        (
            &[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19],
            "DC",
        ),
    ];
    // UTF8String, PrintableString, IA5String: text as is.
    let text = matches!(tag, 0x0c | 0x13 | 0x16)
        .then(|| std::str::from_utf8(value).ok())
        .flatten();
    match (NAMES.iter().find(|(o, _)| *o == oid), text) {
        (Some((_, short)), Some(text)) => format!("{short}={}", escape(text)),
        _ => {
            let hex: String = [tag]
                .iter()
                .chain(der_len(value.len()).iter())
                .chain(value)
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("{}=#{hex}", dotted(oid))
        }
    }
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, c) in text.chars().enumerate() {
        let leading = i == 0 && (c == ' ' || c == '#');
        let trailing = i + 1 == text.chars().count() && c == ' ';
        if matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') || leading || trailing {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn dotted(oid: &[u8]) -> String {
    let mut arcs: Vec<u64> = Vec::new();
    let mut acc: u64 = 0;
    for &b in oid {
        acc = (acc << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if arcs.is_empty() {
                let first = (acc / 40).min(2);
                arcs.push(first);
                arcs.push(acc - first * 40);
            } else {
                arcs.push(acc);
            }
            acc = 0;
        }
    }
    arcs.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

fn der_len(len: usize) -> Vec<u8> {
    if len < 0x80 {
        // Fits the short form, checked just above.
        return vec![len as u8];
    }
    let bytes: Vec<u8> = len
        .to_be_bytes()
        .into_iter()
        .skip_while(|b| *b == 0)
        .collect();
    let mut out = vec![0x80 | bytes.len() as u8];
    out.extend(bytes);
    out
}

/// A cursor over DER bytes (the certificate was already parsed by webpki; this only walks it).
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    /// The next element: its tag and contents.
    fn any(&mut self) -> Option<(u8, &'a [u8])> {
        let (&tag, rest) = self.0.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (len, &rest[n..])
        };
        if rest.len() < len {
            return None;
        }
        let (value, rest) = rest.split_at(len);
        self.0 = rest;
        Some((tag, value))
    }

    /// The next element's contents, if it has tag `tag`.
    fn take(&mut self, tag: u8) -> Option<&'a [u8]> {
        match self.any()? {
            (t, value) if t == tag => Some(value),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::Ca;

    #[test]
    fn a_broker_certificate_names_its_node() {
        let ca = Ca::generate("test CA").unwrap();
        let cert = ca.issue_node(7).unwrap();
        assert_eq!(node_of(&cert.der()), Some(7));
        let client = ca.issue_client("agent-1").unwrap();
        assert_eq!(node_of(&client.der()), None);
    }

    #[test]
    fn a_certificate_naming_two_nodes_names_none() {
        let ca = Ca::generate("test CA").unwrap();
        let cert = ca
            .issue(
                "two",
                &[node_name(1), node_name(2)],
                crate::ca::Validity::default(),
            )
            .unwrap();
        assert_eq!(node_of(&cert.der()), None);
        let padded = ca
            .issue(
                "padded",
                &["kiln-node-01".to_string()],
                crate::ca::Validity::default(),
            )
            .unwrap();
        assert_eq!(node_of(&padded.der()), None);
    }

    #[test]
    fn a_client_principal_is_its_subject_last_rdn_first() {
        let ca = Ca::generate("test CA").unwrap();
        let cert = ca.issue_client("agent, one").unwrap();
        assert_eq!(
            principal_of(&cert.der()).unwrap(),
            "User:CN=agent\\, one,O=Kiln"
        );
    }
}
