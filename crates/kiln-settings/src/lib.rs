//! One settings loader for every Kiln service (broker, agent, dead-letter service, intake,
//! dashboard), so each has the same layers and the same environment scheme:
//!
//! 1. the service's built-in defaults (`T::default()`);
//! 2. a TOML file, when one is given (it must exist);
//! 3. environment variables `KILN_<SERVICE>__<SECTION>__<KEY>`: the service's name, then the
//!    path to the setting, each part in capitals and joined by `__` (`KILN_BROKER__LOG__RETENTION_MS`,
//!    `KILN_AGENT__SSH__USER`, `KILN_DEADLETTER__SMTP__PASSWORD`, `KILN_INTAKE__HTTPS__CERT_FILE`,
//!    `KILN_DASHBOARD__BROKER__SASL_PASSWORD`). A value is taken as written, and converted where
//!    the setting is a number or a boolean, so a secret can stay out of the file and come from
//!    the environment, everywhere, without a password of digits losing its leading zeros.
//!
//! Every key must name a setting: the services' settings refuse unknown fields, so a misspelt
//! file key or variable is an error that names it (a variable by its whole name), never
//! silently ignored. Variables a service read before it had this scheme are refused with the
//! name they now have: the broker's `KILN_<KEY>` (`KILN_LOG__RETENTION_MS`), and the variables
//! `kiln intake serve` and `kiln dashboard` took their flags from (`KILN_DATABASE_URL`,
//! `KILN_HTTPS_CERT`, `KILN_SASL_PASSWORD`, ...). Flags, where a command has them, are applied
//! by the caller on top.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use config::{Config, ConfigError, Environment, File, FileFormat};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A service with settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Broker,
    Agent,
    Deadletter,
    Intake,
    Dashboard,
}

/// The web front door's variables before the scheme, shared by intake and the dashboard:
/// (earlier variable, the setting's path after `KILN_<SERVICE>__`).
const WEB_EARLIER: [(&str, &str); 6] = [
    ("KILN_DATABASE_URL", "DATABASE_URL"),
    ("KILN_BOOTSTRAP", "BOOTSTRAP"),
    ("KILN_HTTPS_CERT", "HTTPS__CERT_FILE"),
    ("KILN_HTTPS_KEY", "HTTPS__KEY_FILE"),
    ("KILN_HTTPS_CLIENT_CA", "HTTPS__CLIENT_CA_FILE"),
    ("KILN_TOKENS_FILE", "TOKENS_FILE"),
];

/// The dashboard's lag sampler took the admin commands' broker variables.
const DASHBOARD_BROKER_EARLIER: [(&str, &str); 7] = [
    ("KILN_TLS_CA", "BROKER__TLS_CA_FILE"),
    ("KILN_TLS_CERT", "BROKER__TLS_CERT_FILE"),
    ("KILN_TLS_KEY", "BROKER__TLS_KEY_FILE"),
    ("KILN_SASL_USER", "BROKER__SASL_USER"),
    ("KILN_SASL_MECHANISM", "BROKER__SASL_MECHANISM"),
    ("KILN_SASL_PASSWORD", "BROKER__SASL_PASSWORD"),
    ("KILN_SASL_PASSWORD_FILE", "BROKER__SASL_PASSWORD_FILE"),
];

impl Service {
    /// Its name in variable names (`KILN_<NAME>__...`) and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Service::Broker => "BROKER",
            Service::Agent => "AGENT",
            Service::Deadletter => "DEADLETTER",
            Service::Intake => "INTAKE",
            Service::Dashboard => "DASHBOARD",
        }
    }

    /// `KILN_<NAME>__`: what every variable of this service starts with.
    pub fn prefix(self) -> String {
        format!("KILN_{}__", self.name())
    }

    /// The command that runs it, for messages.
    fn command(self) -> &'static str {
        match self {
            Service::Broker => "kiln broker",
            Service::Agent => "kiln agent",
            Service::Deadletter => "kiln deadletter",
            Service::Intake => "kiln intake serve",
            Service::Dashboard => "kiln dashboard",
        }
    }

    /// Variables this service read before it had settings of its own, each with the path of
    /// the setting it is now (`KILN_<NAME>__` + path). They are refused, never ignored: a
    /// dashboard that quietly ignored `KILN_DATABASE_URL` would open the default store.
    /// (The broker's earlier names follow a rule instead: `refuse_old_broker_name`.)
    pub fn earlier_names(self) -> Vec<(&'static str, &'static str)> {
        match self {
            Service::Intake => WEB_EARLIER.to_vec(),
            Service::Dashboard => WEB_EARLIER
                .iter()
                .chain(DASHBOARD_BROKER_EARLIER.iter())
                .copied()
                .collect(),
            Service::Broker | Service::Agent | Service::Deadletter => Vec::new(),
        }
    }
}

/// Why settings could not be loaded. Each names the file or variable at fault.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("settings file {0} does not exist")]
    NoFile(String),
    #[error("{var} is not read by {command} any more: set {instead}")]
    OldName {
        var: String,
        command: &'static str,
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
    /// A variable that names no setting, or holds a value its setting does not take.
    #[error("environment variable {var}: {error}")]
    Variable { var: String, error: String },
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
    let earlier = service.earlier_names();
    // The setting's path (lower case, `__` between parts) -> (the variable, its value); sorted,
    // so the variable blamed for an error is the same on every run.
    let mut vars = BTreeMap::new();
    for (key, value) in env {
        if let Some(rest) = key.strip_prefix(&prefix) {
            vars.insert(rest.to_ascii_lowercase(), (key, value));
        } else if let Some((_, path)) = earlier.iter().find(|(old, _)| *old == key) {
            return Err(SettingsError::OldName {
                var: key,
                command: service.command(),
                instead: format!("{prefix}{path}"),
            });
        } else if service == Service::Broker {
            refuse_old_broker_name(&key, &top)?;
        }
    }
    if let Some(path) = file {
        if !path.exists() {
            return Err(SettingsError::NoFile(path.display().to_string()));
        }
    }
    let layers = Layers {
        defaults: &defaults,
        file,
    };
    let all = vars
        .iter()
        .map(|(path, (_, value))| (path.clone(), value.clone()));
    match layers.build(all.collect()) {
        Ok(settings) => Ok(settings),
        Err(error) => Err(layers.blame(service, &vars, error)),
    }
}

/// The layers below the environment: the defaults and the file.
struct Layers<'a, T> {
    defaults: &'a T,
    file: Option<&'a Path>,
}

impl<T: Serialize + DeserializeOwned> Layers<'_, T> {
    /// The settings with `vars` (path -> value) on top of the defaults and the file.
    fn build(&self, vars: HashMap<String, String>) -> Result<T, ConfigError> {
        let mut builder = Config::builder().add_source(Config::try_from(self.defaults)?);
        if let Some(path) = self.file {
            builder = builder.add_source(File::from(path).format(FileFormat::Toml));
        }
        // No `try_parsing`: a value stays the string it was ("007" is not 7) until the setting's
        // type asks for a number or a boolean, which the deserializer then parses.
        builder
            .add_source(Environment::default().separator("__").source(Some(vars)))
            .build()?
            .try_deserialize()
    }

    /// Which layer `error` comes from: the file, or else the first variable that fails on its
    /// own, named in full (`KILN_DASHBOARD__HTTPS__CERT`), never with its value.
    fn blame(
        &self,
        service: Service,
        vars: &BTreeMap<String, (String, String)>,
        error: ConfigError,
    ) -> SettingsError {
        let invalid = |error: ConfigError| SettingsError::Invalid {
            service: service.name(),
            file: self
                .file
                .map_or("(no file)".into(), |p| p.display().to_string()),
            error: error.to_string(),
        };
        if let Err(error) = self.build(HashMap::new()) {
            return invalid(error);
        }
        for (path, (var, value)) in vars {
            let one = HashMap::from([(path.clone(), value.clone())]);
            if let Err(error) = self.build(one) {
                return SettingsError::Variable {
                    var: var.clone(),
                    error: error.to_string(),
                };
            }
        }
        // Each variable is fine alone; only together do they fail.
        invalid(error)
    }
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
            command: Service::Broker.command(),
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
    fn a_variable_at_fault_is_named_in_full_and_its_value_never_shown() {
        let err = refusal(
            Service::Agent,
            None,
            &[
                ("KILN_AGENT__SSH__USER", "fine"),
                ("KILN_AGENT__SSH__PASSWROD", "hunter2-env"),
            ],
        );
        assert!(err.contains("KILN_AGENT__SSH__PASSWROD"), "{err}");
        assert!(
            err.contains("passwrod") && !err.contains("hunter2"),
            "{err}"
        );
        let err = refusal(Service::Agent, None, &[("KILN_AGENT__SSH__PORT", "ssh")]);
        assert!(err.contains("KILN_AGENT__SSH__PORT"), "{err}");
        // A bad file is blamed on the file, not on the variables beside it.
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "[ssh]\nprot = 1").unwrap();
        let err = refusal(
            Service::Agent,
            Some(file.path()),
            &[("KILN_AGENT__SSH__USER", "ops")],
        );
        assert!(
            err.contains("prot") && err.contains(&file.path().display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn values_are_taken_as_written_and_converted_only_where_the_setting_asks() {
        let s: Settings = load(
            Service::Agent,
            None,
            env(&[
                ("KILN_AGENT__AGENT_ID", "007"),
                ("KILN_AGENT__SSH__USER", "1e3"),
                ("KILN_AGENT__SSH__PORT", "2222"),
                ("KILN_AGENT__VERBOSE", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(s.agent_id, "007", "a password of digits keeps its zeros");
        assert_eq!(s.ssh.user, "1e3");
        assert_eq!(s.ssh.port, 2222);
        assert!(s.verbose);
    }

    #[test]
    fn the_web_services_earlier_variables_are_refused_with_their_new_name() {
        for (service, old, new) in [
            (
                Service::Intake,
                "KILN_DATABASE_URL",
                "KILN_INTAKE__DATABASE_URL",
            ),
            (
                Service::Intake,
                "KILN_HTTPS_CERT",
                "KILN_INTAKE__HTTPS__CERT_FILE",
            ),
            (
                Service::Dashboard,
                "KILN_TOKENS_FILE",
                "KILN_DASHBOARD__TOKENS_FILE",
            ),
            (
                Service::Dashboard,
                "KILN_SASL_PASSWORD",
                "KILN_DASHBOARD__BROKER__SASL_PASSWORD",
            ),
        ] {
            let err = refusal(service, None, &[(old, "hunter2-old")]);
            assert!(err.contains(old) && err.contains(new), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
        // The other services never read them: nothing to refuse.
        let s: Settings = load(
            Service::Agent,
            None,
            env(&[("KILN_DATABASE_URL", "x"), ("KILN_SASL_PASSWORD", "y")]),
        )
        .unwrap();
        assert_eq!(s, Settings::default());
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
