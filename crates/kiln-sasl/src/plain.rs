//! PLAIN (RFC 4616): one message, `[authzid] NUL authcid NUL passwd`.

use crate::{check_user_name, SaslError, MESSAGE_BYTES_MAX, PASSWORD_BYTES_MAX};

/// (user, password) from a PLAIN message. An authorization id, when present, must name the
/// user itself: Kiln has no proxy users (Kafka refuses others the same way).
pub fn parse_plain(message: &[u8]) -> Result<(String, Vec<u8>), SaslError> {
    if message.len() > MESSAGE_BYTES_MAX {
        return Err(SaslError::Malformed(format!(
            "PLAIN message of {} bytes (at most {MESSAGE_BYTES_MAX})",
            message.len()
        )));
    }
    let mut parts = message.split(|b| *b == 0);
    let (Some(authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(SaslError::Malformed(
            "PLAIN is [authzid] NUL user NUL password".into(),
        ));
    };
    let user = std::str::from_utf8(user)
        .map_err(|_| SaslError::Malformed("PLAIN user name is not UTF-8".into()))?;
    check_user_name(user).map_err(SaslError::Malformed)?;
    if !authzid.is_empty() && authzid != user.as_bytes() {
        return Err(SaslError::Unsupported(
            "an authorization id other than the user itself",
        ));
    }
    if password.is_empty() || password.len() > PASSWORD_BYTES_MAX {
        return Err(SaslError::Malformed(format!(
            "PLAIN password must be 1 to {PASSWORD_BYTES_MAX} bytes"
        )));
    }
    Ok((user.to_string(), password.to_vec()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn plain_messages() {
        assert_eq!(
            parse_plain(b"\0alice\0secret").unwrap(),
            ("alice".to_string(), b"secret".to_vec())
        );
        assert_eq!(parse_plain(b"alice\0alice\0secret").unwrap().0, "alice");
        assert!(matches!(
            parse_plain(b"bob\0alice\0secret"),
            Err(SaslError::Unsupported(_))
        ));
        for bad in [
            &b"alice\0secret"[..],
            b"\0\0secret",
            b"\0alice\0",
            b"\0a\0b\0c",
        ] {
            assert!(
                matches!(parse_plain(bad), Err(SaslError::Malformed(_))),
                "{bad:?}"
            );
        }
    }
}
