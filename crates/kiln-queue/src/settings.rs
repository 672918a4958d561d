//! A service's extra librdkafka settings (`[kafka]` in the agent's and the dead-letter
//! service's config files): passed to librdkafka as they are, printed by `Debug` with every
//! secret hidden, and with the SASL password optionally read from a file
//! (`kafka_password_file`) so it need not sit in the config file.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The setting a password file fills in.
pub const SASL_PASSWORD: &str = "sasl.password";

/// Extra librdkafka settings (see the module docs).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KafkaSettings(pub BTreeMap<String, String>);

/// Whether librdkafka treats the setting as a secret (`sasl.password`, `ssl.key.password`,
/// `ssl.keystore.password`, `sasl.oauthbearer.client.secret`, ...), or it holds one: a private
/// key in PEM (`ssl.key.pem`) or OAUTHBEARER's unsecured token settings
/// (`sasl.oauthbearer.config`).
pub fn is_secret(key: &str) -> bool {
    let key = key.trim().to_ascii_lowercase();
    key.contains("password")
        || key.contains("secret")
        || key == "ssl.key.pem"
        || key == "sasl.oauthbearer.config"
}

/// What `Debug` shows of a setting's value: `<hidden>` for a secret.
pub(crate) fn shown_value<'a>(key: &str, value: &'a str) -> &'a str {
    if is_secret(key) {
        "<hidden>"
    } else {
        value
    }
}

impl std::fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, shown_value(k, v))))
            .finish()
    }
}

impl<'a> IntoIterator for &'a KafkaSettings {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl KafkaSettings {
    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter()
    }

    /// Sets `sasl.password` from the first line of `file` (`setting` names it in errors). An
    /// error when `[kafka]` already sets a password: two sources for one secret is a mistake.
    pub fn add_password_file(&mut self, setting: &str, file: &Path) -> anyhow::Result<()> {
        self.refuse_second_password(setting)?;
        let password = kiln_settings::read_secret_file(setting, file)?;
        self.add_password(setting, &password)
    }

    /// Sets `sasl.password` from a setting of its own (`setting`: its name in errors), so the
    /// password can come from the environment. The same refusals as `add_password_file`, and
    /// an empty password is one.
    pub fn add_password(&mut self, setting: &str, password: &str) -> anyhow::Result<()> {
        self.refuse_second_password(setting)?;
        if password.is_empty() {
            anyhow::bail!("{setting} is empty");
        }
        self.0
            .insert(SASL_PASSWORD.to_string(), password.to_string());
        Ok(())
    }

    fn refuse_second_password(&self, setting: &str) -> anyhow::Result<()> {
        if self.0.contains_key(SASL_PASSWORD) {
            anyhow::bail!("set [kafka] \"{SASL_PASSWORD}\" or {setting}, not both");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn debug_hides_secrets_and_a_password_file_fills_sasl_password() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret-pw\nignored\n").unwrap();
        let mut k = KafkaSettings::default();
        k.0.insert("security.protocol".into(), "SASL_SSL".into());
        k.0.insert("ssl.key.password".into(), "key-pw".into());
        k.add_password_file("kafka_password_file", &file).unwrap();
        assert_eq!(k.0[SASL_PASSWORD], "s3cret-pw");
        let shown = format!("{k:?}");
        assert!(
            shown.contains("SASL_SSL") && !shown.contains("pw\""),
            "{shown}"
        );
        assert!(
            !shown.contains("s3cret") && !shown.contains("key-pw"),
            "{shown}"
        );
        let err = k
            .add_password_file("kafka_password_file", &file)
            .unwrap_err();
        assert!(err.to_string().contains("not both"), "{err}");
        std::fs::write(&file, "\n").unwrap();
        let err = KafkaSettings::default()
            .add_password_file("kafka_password_file", &file)
            .unwrap_err();
        assert!(err.to_string().contains("first line is empty"), "{err}");
    }
}
