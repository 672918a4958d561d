//! One settings loader for every Kiln service that reads a settings file (broker, agent,
//! dead-letter service), so each has the same layers and the same environment scheme:
//!
//! 1. the service's built-in defaults (`T::default()`);
//! 2. a TOML file, when one is given (it must exist);
//! 3. environment variables `KILN_<SERVICE>__<SECTION>__<KEY>`: the service's name, then the
//!    path to the setting, each part in capitals and joined by `__` (`KILN_BROKER__LOG__RETENTION_MS`,
//!    `KILN_AGENT__SSH__USER`, `KILN_DEADLETTER__SMTP__PASSWORD`). Values are parsed as numbers
//!    and booleans where the setting is one. So a secret can stay out of the file and come from
//!    the environment, everywhere.
//!
//! Every key must name a setting: the services' settings refuse unknown fields, so a misspelt
//! file key or variable is an error that names it, never silently ignored. Variables of the
//! broker's earlier scheme (`KILN_LOG__RETENTION_MS`, no service name) are refused with the
//! name they now have. Flags, where a command has them, are applied by the caller on top.

use std::collections::HashMap;
use std::path::Path;

use config::{Config, Environment, File, FileFormat};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A service with a settings file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Broker,
    Agent,
    Deadletter,
}

impl Service {
    /// Its name in variable names (`KILN_<NAME>__...`) and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Service::Broker => "BROKER",
            Service::Agent => "AGENT",
            Service::Deadletter => "DEADLETTER",
        }
    }

    /// `KILN_<NAME>__`: what every variable of this service starts with.
    pub fn prefix(self) -> String {
        format!("KILN_{}__", self.name())
    }
}

/// Why settings could not be loaded. Each names the file or variable at fault.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("settings file {0} does not exist")]
    NoFile(String),
    #[error("{var} is not a {service} setting any more: set {instead}")]
    OldName {
        var: String,
        service: &'static str,
        instead: String,
    },
    #[error("encoding the built-in defaults: {0}")]
    Defaults(String),
    #[error("reading {service} settings ({file}): {error}")]
    Invalid {
        service: &'static str,
        /// The file, or "(no file)".
        file: String,
        error: String,
    },
    #[error("{setting} {path}: {reason}")]
    Secret {
        setting: String,
        path: String,
        reason: String,
    },
}

/// Largest secret file read, in bytes: a password or key, not data.
pub const SECRET_FILE_BYTES_MAX: u64 = 64 * 1024;

/// The secret in a `*_password_file` setting's file: its first line, without the line end.
/// Errors name the setting and the file, never what the file holds; an empty secret is one.
pub fn read_secret_file(setting: &str, path: &Path) -> Result<String, SettingsError> {
    let fail = |reason: String| SettingsError::Secret {
        setting: setting.to_string(),
        path: path.display().to_string(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if meta.len() > SECRET_FILE_BYTES_MAX {
        return Err(fail(format!(
            "is {} bytes; a secret file holds at most {SECRET_FILE_BYTES_MAX}",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let secret = text.lines().next().unwrap_or("").trim_end_matches('\r');
    if secret.is_empty() {
        return Err(fail("its first line is empty".into()));
    }
    Ok(secret.to_string())
}

/// Loads `T` for `service`: defaults, then `file` (if given), then the service's variables in
/// `env` (the process environment in production: `std::env::vars()`). See the module docs.
pub fn load<T>(
    service: Service,
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<T, SettingsError>
where
    T: Serialize + DeserializeOwned + Default,
{
    let defaults = T::default();
    let top = top_level_keys(&defaults)?;
    let prefix = service.prefix();
    let mut vars = HashMap::new();
    for (key, value) in env {
        if let Some(rest) = key.strip_prefix(&prefix) {
            vars.insert(rest.to_ascii_lowercase(), value);
        } else if service == Service::Broker {
            refuse_old_broker_name(&key, &top)?;
        }
    }
    let mut builder = Config::builder().add_source(
        Config::try_from(&defaults).map_err(|e| SettingsError::Defaults(e.to_string()))?,
    );
    if let Some(path) = file {
        if !path.exists() {
            return Err(SettingsError::NoFile(path.display().to_string()));
        }
        builder = builder.add_source(File::from(path).format(FileFormat::Toml));
    }
    builder = builder.add_source(
        Environment::default()
            .separator("__")
            .try_parsing(true)
            .source(Some(vars)),
    );
    builder
        .build()
        .and_then(|c| c.try_deserialize())
        .map_err(|e| SettingsError::Invalid {
            service: service.name(),
            file: file.map_or("(no file)".into(), |p| p.display().to_string()),
            error: e.to_string(),
        })
}

/// The broker's settings were once `KILN_<KEY>` with no service name. Such a variable, if its
/// first part names a broker setting, is refused rather than ignored (`KILN_BOOTSTRAP`,
/// `KILN_CONFIG` and the like, which name no broker setting, belong to other commands).
fn refuse_old_broker_name(key: &str, top: &[String]) -> Result<(), SettingsError> {
    let Some(rest) = key.strip_prefix("KILN_") else {
        return Ok(());
    };
    let first = rest
        .split("__")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    if top.contains(&first) {
        return Err(SettingsError::OldName {
            var: key.to_string(),
            service: Service::Broker.name(),
            instead: format!("{}{rest}", Service::Broker.prefix()),
        });
    }
    Ok(())
}

fn top_level_keys<T: Serialize>(defaults: &T) -> Result<Vec<String>, SettingsError> {
    match serde_json::to_value(defaults) {
        Ok(serde_json::Value::Object(map)) => Ok(map.keys().cloned().collect()),
        Ok(_) => Err(SettingsError::Defaults("settings are not a table".into())),
        Err(e) => Err(SettingsError::Defaults(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::io::Write;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Ssh {
        user: String,
        port: u16,
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Settings {
        agent_id: String,
        max_attempts: u32,
        verbose: bool,
        ssh: Ssh,
    }

    impl Default for Ssh {
        fn default() -> Self {
            Ssh {
                user: "root".into(),
                port: 22,
            }
        }
    }

    impl Default for Settings {
        fn default() -> Self {
            Settings {
                agent_id: "a".into(),
                max_attempts: 10,
                verbose: false,
                ssh: Ssh::default(),
            }
        }
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_then_file_then_environment_with_sections() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "agent_id = \"from-file\"\n[ssh]\nuser = \"burnin\"\nport = 2222"
        )
        .unwrap();
        let s: Settings = load(
            Service::Agent,
            Some(file.path()),
            env(&[
                ("KILN_AGENT__SSH__USER", "ops"),
                ("KILN_AGENT__VERBOSE", "true"),
                ("KILN_AGENT_CONFIG", "/etc/kiln/agent.toml"),
                ("KILN_BOOTSTRAP", "b:9092"),
                ("KILN_DEADLETTER__SSH__USER", "not-for-the-agent"),
            ]),
        )
        .unwrap();
        assert_eq!(s.agent_id, "from-file");
        assert_eq!(
            s.ssh.user, "ops",
            "a variable reaches a key inside a section"
        );
        assert_eq!(s.ssh.port, 2222);
        assert!(s.verbose);
        assert_eq!(s.max_attempts, 10);
        let s: Settings = load(Service::Agent, None, env(&[])).unwrap();
        assert_eq!(s, Settings::default());
    }

    /// The error `load` gives, as text.
    fn refusal(service: Service, file: Option<&Path>, vars: &[(&str, &str)]) -> String {
        load::<Settings>(service, file, env(vars))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn every_bad_key_or_value_is_named() {
        let err = refusal(Service::Agent, None, &[("KILN_AGENT__SSH__USR", "x")]);
        assert!(err.contains("usr"), "{err}");
        let err = refusal(
            Service::Agent,
            None,
            &[("KILN_AGENT__MAX_ATTEMPTS", "many")],
        );
        assert!(err.contains("max_attempts"), "{err}");
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "agnet_id = \"x\"").unwrap();
        let err = refusal(Service::Agent, Some(file.path()), &[]);
        assert!(err.contains("agnet_id"), "{err}");
        assert!(err.contains(&file.path().display().to_string()), "{err}");
        let err = refusal(Service::Agent, Some(Path::new("/nonexistent.toml")), &[]);
        assert!(err.contains("does not exist"), "{err}");
    }

    #[test]
    fn the_brokers_earlier_names_are_refused_with_their_new_name() {
        let err = refusal(Service::Broker, None, &[("KILN_SSH__PORT", "1")]);
        assert!(err.contains("KILN_BROKER__SSH__PORT"), "{err}");
        // Variables of other commands name no broker setting and are left alone.
        let s: Settings = load(
            Service::Broker,
            None,
            env(&[
                ("KILN_CONFIG", "x"),
                ("KILN_BOOTSTRAP", "y"),
                ("KILN_BROKER__SSH__PORT", "3"),
            ]),
        )
        .unwrap();
        assert_eq!(s.ssh.port, 3);
    }
}
