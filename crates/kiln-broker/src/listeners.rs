//! Kafka listeners: the main one (`listen`, secured by `[tls]` and `[sasl]` as they are set)
//! and up to [`LISTENERS_MAX`] more (`[[listeners]]`), each with its own address, advertised
//! address and security protocol, as Kafka's `listeners` / `advertised.listeners` /
//! `listener.security.protocol.map` are. A typical pair: PLAINTEXT on loopback for the
//! broker host's own tools, SASL_SSL on the network.
//!
//! Metadata, DescribeCluster and FindCoordinator answer with each broker's address *on the
//! listener the request came in on*: a client that bootstrapped over SASL_SSL is sent to
//! every broker's SASL_SSL address, never to a loopback one. In a cluster every peer names its
//! address for every extra listener (`[[cluster.peers]] listeners = { local = "..." }`).
//!
//! The certificate (`[tls]`) and the SASL mechanisms and users (`[sasl]`) are the broker's;
//! a listener chooses whether it uses them. The main listener uses what is set unless
//! `security_protocol` says otherwise (PLAINTEXT with `[tls]` set for an SSL listener only).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// The main listener's name (`listen`), in peers' maps and in logs.
pub const MAIN_LISTENER: &str = "main";
/// Extra listeners one broker may have.
pub const LISTENERS_MAX: usize = 8;
/// Longest listener name, in bytes.
pub const NAME_BYTES_MAX: usize = 64;

/// How a listener's clients connect, in Kafka's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    /// The main listener's: TLS with `[tls]`, SASL with `[sasl]`.
    pub fn of_main(tls: bool, sasl: bool) -> SecurityProtocol {
        match (tls, sasl) {
            (false, false) => SecurityProtocol::Plaintext,
            (true, false) => SecurityProtocol::Ssl,
            (false, true) => SecurityProtocol::SaslPlaintext,
            (true, true) => SecurityProtocol::SaslSsl,
        }
    }
}

/// One `[[listeners]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSettings {
    /// 1 to 64 of `A-Z a-z 0-9 _ -`, not `main`; peers' `listeners` maps use it.
    pub name: String,
    pub listen: SocketAddr,
    /// `host:port` this listener's clients are told; defaults to `listen`.
    #[serde(default)]
    pub advertised_address: Option<String>,
    /// PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; SSL needs `[tls]`, SASL `[sasl]`.
    pub security_protocol: SecurityProtocol,
}

impl ListenerSettings {
    pub fn advertised(&self) -> String {
        self.advertised_address
            .clone()
            .unwrap_or_else(|| self.listen.to_string())
    }
}

fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(format!(
            "listener name {name:?} must be 1 to {NAME_BYTES_MAX} bytes"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-')))
    {
        return Err(format!(
            "listener name {name:?}: {c:?} is not allowed (A-Z a-z 0-9 _ -)"
        ));
    }
    if name == MAIN_LISTENER {
        return Err(format!(
            "listener name {MAIN_LISTENER:?} is the main listener's (listen)"
        ));
    }
    Ok(())
}

/// A TLS protocol needs `[tls]`, a SASL one `[sasl]`.
fn needs(what: &str, protocol: SecurityProtocol, tls: bool, sasl: bool) -> Result<(), String> {
    if protocol.tls() && !tls {
        return Err(format!(
            "{what} is {} but [tls] is not set (the broker's certificate)",
            protocol.name()
        ));
    }
    if protocol.sasl() && !sasl {
        return Err(format!(
            "{what} is {} but [sasl] is not set (the mechanisms and users)",
            protocol.name()
        ));
    }
    Ok(())
}

/// Checks the extra listeners and the main one (`main`, on `main_listen`), `[tls]` and `[sasl]`
/// (`tls`, `sasl`: whether they are set) and, in a cluster, the peers' maps of listener
/// addresses.
pub fn validate(
    listeners: &[ListenerSettings],
    main: SecurityProtocol,
    main_listen: SocketAddr,
    tls: bool,
    sasl: bool,
    peers: Option<&[crate::config::PeerSettings]>,
) -> Result<(), String> {
    needs("the main listener (security_protocol)", main, tls, sasl)?;
    if listeners.len() > LISTENERS_MAX {
        return Err(format!(
            "at most {LISTENERS_MAX} [[listeners]], got {}",
            listeners.len()
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    let mut ports = vec![main_listen];
    for l in listeners {
        validate_name(&l.name)?;
        if !names.insert(l.name.as_str()) {
            return Err(format!("listener {:?} is named twice", l.name));
        }
        let what = format!("listener {:?}", l.name);
        needs(&what, l.security_protocol, tls, sasl)?;
        // Port 0 picks a free port for each, so only fixed ones can clash.
        if l.listen.port() != 0 && ports.contains(&l.listen) {
            return Err(format!("{what}: {} is already listened on", l.listen));
        }
        ports.push(l.listen);
        crate::config::split_host_port(&l.advertised())
            .map_err(|e| format!("{what}: advertised_address {e}"))?;
    }
    let Some(peers) = peers else { return Ok(()) };
    for peer in peers {
        for (name, address) in &peer.listeners {
            if !names.contains(name.as_str()) {
                return Err(format!(
                    "cluster peer {}: listener {name:?} is not in [[listeners]] (every broker has the same listeners)",
                    peer.id
                ));
            }
            crate::config::split_host_port(address)
                .map_err(|e| format!("cluster peer {}: listener {name:?} {e}", peer.id))?;
        }
        for name in &names {
            if !peer.listeners.contains_key(*name) {
                return Err(format!(
                    "cluster peer {} has no address for listener {name:?}: add it to its listeners map",
                    peer.id
                ));
            }
        }
    }
    Ok(())
}

/// A broker's addresses on the extra listeners, as `(host, port)` by listener name.
pub type Endpoints = BTreeMap<String, (String, i32)>;

/// What a connection knows of the listener it came in on.
#[derive(Debug)]
pub struct Listener {
    pub name: String,
    pub security: SecurityProtocol,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn listener(name: &str, port: u16, security: SecurityProtocol) -> ListenerSettings {
        ListenerSettings {
            name: name.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            advertised_address: None,
            security_protocol: security,
        }
    }

    const P: SecurityProtocol = SecurityProtocol::Plaintext;

    #[test]
    fn listeners_are_checked_against_tls_sasl_ports_and_peers() {
        let any = SocketAddr::from(([127, 0, 0, 1], 1));
        let err = validate(&[], SecurityProtocol::SaslSsl, any, true, false, None).unwrap_err();
        assert!(
            err.contains("the main listener") && err.contains("[sasl]"),
            "{err}"
        );
        let main = SocketAddr::from(([127, 0, 0, 1], 9092));
        let local = listener("local", 9192, SecurityProtocol::Plaintext);
        assert_eq!(
            validate(std::slice::from_ref(&local), P, main, false, false, None),
            Ok(())
        );
        let cases = [
            (
                vec![listener("main", 1, SecurityProtocol::Plaintext)],
                "main listener",
            ),
            (
                vec![listener("a b", 1, SecurityProtocol::Plaintext)],
                "not allowed",
            ),
            (
                vec![listener("s", 1, SecurityProtocol::Ssl)],
                "[tls] is not set",
            ),
            (
                vec![listener("s", 1, SecurityProtocol::SaslPlaintext)],
                "[sasl] is not set",
            ),
            (
                vec![listener("x", 9092, SecurityProtocol::Plaintext)],
                "already listened on",
            ),
            (vec![local.clone(), local.clone()], "named twice"),
        ];
        for (listeners, why) in cases {
            let err = validate(&listeners, P, main, false, false, None).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        let peer = |listeners: &[(&str, &str)]| crate::config::PeerSettings {
            id: 1,
            kafka: "h:9092".into(),
            raft: "h:9093".into(),
            listeners: listeners
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let ok = [peer(&[("local", "127.0.0.1:9192")])];
        assert_eq!(
            validate(
                std::slice::from_ref(&local),
                P,
                main,
                false,
                false,
                Some(&ok)
            ),
            Ok(())
        );
        for (peers, why) in [
            ([peer(&[])], "has no address for listener"),
            (
                [peer(&[("local", "x:1"), ("other", "y:2")])],
                "not in [[listeners]]",
            ),
            ([peer(&[("local", "nonsense")])], "listener \"local\""),
        ] {
            let err = validate(
                std::slice::from_ref(&local),
                P,
                main,
                false,
                false,
                Some(&peers),
            )
            .unwrap_err();
            assert!(err.contains(why), "{err}");
        }
    }
}
