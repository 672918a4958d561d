//! `kiln dashboard`'s settings: built-in defaults (today's flag defaults), then
//! `--config FILE` (deploy/dashboard.example.toml), then `KILN_DASHBOARD__<SECTION>__<KEY>`
//! variables (`kiln_settings::load`), then the flags.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use kiln_settings::Service;
use serde::{Deserialize, Serialize};

use crate::broker_address::BrokerLogin;
use crate::settings::{over, over_some};
use crate::web_args::{HttpsSettings, WebArgs};

/// `Debug` shows `database_url` without its password and no SASL password.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DashboardSettings {
    /// Address the pages are served on.
    pub listen: SocketAddr,
    /// The results store (`sqlite://PATH` or `postgres://...`).
    pub database_url: String,
    /// A file whose first line is PostgreSQL's password, kept out of `database_url`.
    pub database_password_file: Option<PathBuf>,
    /// The broker consumer lag is sampled from (Kiln, Apache Kafka or Redpanda).
    pub bootstrap: String,
    /// Sample consumer lag (false: no broker needed).
    pub lag: bool,
    /// Seconds between lag samples, 0.1 to 3600.
    pub lag_interval_s: f64,
    /// Seconds between automatic page reloads in the browser (0: never).
    pub refresh_s: u64,
    /// Bearer tokens (kiln tokens create); every page but /healthz needs a `read` one.
    pub tokens_file: Option<PathBuf>,
    /// Serve without authentication on an address other than loopback.
    pub insecure_no_auth: bool,
    pub https: HttpsSettings,
    /// How the lag sampler reaches the broker: timeout, TLS, SASL.
    pub broker: BrokerLogin,
}

impl Default for DashboardSettings {
    fn default() -> Self {
        DashboardSettings {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            database_url: "sqlite://kiln.db".into(),
            database_password_file: None,
            bootstrap: "127.0.0.1:9092".into(),
            lag: true,
            lag_interval_s: 5.0,
            refresh_s: 10,
            tokens_file: None,
            insecure_no_auth: false,
            https: HttpsSettings::default(),
            broker: BrokerLogin::default(),
        }
    }
}

impl std::fmt::Debug for DashboardSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field named, so a new one cannot slip past this without a decision here.
        let DashboardSettings {
            listen,
            database_url,
            database_password_file,
            bootstrap,
            lag,
            lag_interval_s,
            refresh_s,
            tokens_file,
            insecure_no_auth,
            https,
            broker,
        } = self;
        f.debug_struct("DashboardSettings")
            .field("listen", listen)
            .field("database_url", &kiln_store::redact_url(database_url))
            .field("database_password_file", database_password_file)
            .field("bootstrap", bootstrap)
            .field("lag", lag)
            .field("lag_interval_s", lag_interval_s)
            .field("refresh_s", refresh_s)
            .field("tokens_file", tokens_file)
            .field("insecure_no_auth", insecure_no_auth)
            .field("https", https)
            .field("broker", broker)
            .finish()
    }
}

/// `kiln dashboard`'s flags: each overrides its setting. None reads a variable of its own:
/// those are KILN_DASHBOARD__<SECTION>__<KEY>, read with the settings.
#[derive(Args, Debug, Default)]
pub struct DashboardArgs {
    /// Settings file (TOML; deploy/dashboard.example.toml). KILN_DASHBOARD__<SECTION>__<KEY>
    /// variables override it (KILN_DASHBOARD__BROKER__SASL_PASSWORD), flags override both.
    #[arg(long, env = "KILN_DASHBOARD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to serve HTTP on [default: 127.0.0.1:8080]. Setting: listen.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Results store: sqlite://PATH or postgres://USER@HOST:PORT/DB [default:
    /// sqlite://kiln.db]. Setting: database_url (a password is better kept there, or in
    /// database_password_file, than on a command line).
    #[arg(long)]
    pub database_url: Option<String>,
    /// The broker consumer lag is sampled from [default: 127.0.0.1:9092]. Setting: bootstrap.
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// How long to wait for the broker, in seconds [default: 10]. Setting: [broker] timeout_s.
    #[arg(long)]
    pub timeout_s: Option<u64>,
    /// Reach the broker over TLS, trusting this CA file (PEM). Setting: [broker] tls_ca_file.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a listener that requires one; needs a key. Setting:
    /// [broker] tls_cert_file.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM). Setting: [broker] tls_key_file.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Log in to a `[sasl]` listener as this user; the password from --sasl-password-file or
    /// the settings (sasl_password_file, sasl_password), never a flag. Setting: [broker]
    /// sasl_user.
    #[arg(long)]
    pub sasl_user: Option<String>,
    /// SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN [default: SCRAM-SHA-512]. Setting: [broker]
    /// sasl_mechanism.
    #[arg(long)]
    pub sasl_mechanism: Option<String>,
    /// File whose first line is the SASL password. Setting: [broker] sasl_password_file.
    #[arg(long)]
    pub sasl_password_file: Option<PathBuf>,
    #[command(flatten)]
    pub web: WebArgs,
    /// Do not sample consumer lag (no broker needed). Setting: lag = false.
    #[arg(long)]
    pub no_lag: bool,
    /// Seconds between lag samples [default: 5]. Setting: lag_interval_s.
    #[arg(long)]
    pub lag_interval_s: Option<f64>,
    /// Seconds between automatic page reloads in the browser (0: never) [default: 10].
    /// Setting: refresh_s.
    #[arg(long)]
    pub refresh_s: Option<u64>,
}

impl DashboardSettings {
    /// Defaults, the file, the variables in `env`, then the flags in `args`; validated.
    pub fn load(
        args: &DashboardArgs,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> anyhow::Result<DashboardSettings> {
        let mut s: DashboardSettings =
            kiln_settings::load(Service::Dashboard, args.config.as_deref(), env)
                .context("reading dashboard settings")?;
        over(&mut s.listen, &args.listen);
        over(&mut s.database_url, &args.database_url);
        over(&mut s.bootstrap, &args.bootstrap);
        over(&mut s.lag_interval_s, &args.lag_interval_s);
        over(&mut s.refresh_s, &args.refresh_s);
        over(&mut s.broker.timeout_s, &args.timeout_s);
        over(&mut s.broker.sasl_mechanism, &args.sasl_mechanism);
        over_some(&mut s.broker.tls_ca_file, &args.tls_ca);
        over_some(&mut s.broker.tls_cert_file, &args.tls_cert);
        over_some(&mut s.broker.tls_key_file, &args.tls_key);
        over_some(&mut s.broker.sasl_user, &args.sasl_user);
        if args.sasl_password_file.is_some() {
            // A flag wins over the settings' password, whichever form it had there.
            s.broker.sasl_password = None;
            s.broker
                .sasl_password_file
                .clone_from(&args.sasl_password_file);
        }
        if args.no_lag {
            s.lag = false;
        }
        args.web
            .apply(&mut s.https, &mut s.tokens_file, &mut s.insecure_no_auth);
        if !(s.lag_interval_s.is_finite() && (0.1..=3600.0).contains(&s.lag_interval_s)) {
            bail!(
                "lag_interval_s (--lag-interval-s) {} is out of range: give 0.1 to 3600 seconds",
                s.lag_interval_s
            );
        }
        if s.lag && s.bootstrap.trim().is_empty() {
            bail!("bootstrap is empty: name the broker, or set lag = false (--no-lag)");
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::Path;

    use super::*;
    use crate::settings::test_support::{env, file};

    fn with_config(f: &tempfile::NamedTempFile) -> DashboardArgs {
        DashboardArgs {
            config: Some(f.path().to_path_buf()),
            ..Default::default()
        }
    }

    fn error(args: &DashboardArgs, vars: &[(&str, &str)]) -> String {
        format!(
            "{:#}",
            DashboardSettings::load(args, env(vars)).unwrap_err()
        )
    }

    #[test]
    fn defaults_are_the_flags_defaults() {
        let s = DashboardSettings::load(&DashboardArgs::default(), env(&[])).unwrap();
        assert_eq!(s, DashboardSettings::default());
        assert_eq!(s.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.bootstrap, "127.0.0.1:9092");
        assert!(s.lag);
        assert_eq!(
            (s.lag_interval_s, s.refresh_s, s.broker.timeout_s),
            (5.0, 10, 10)
        );
        assert_eq!(s.broker.sasl_mechanism, "SCRAM-SHA-512");
    }

    #[test]
    fn default_then_file_then_environment_then_flag() {
        let f = file(
            "refresh_s = 30\nlag_interval_s = 2\nbootstrap = \"file:9092\"\n\
             [broker]\ntimeout_s = 3\nsasl_user = \"file-user\"\ntls_ca_file = \"/file-ca\"\n",
        );
        let mut args = with_config(&f);
        args.sasl_user = Some("flag-user".into());
        args.lag_interval_s = Some(0.5);
        let s = DashboardSettings::load(
            &args,
            env(&[
                ("KILN_DASHBOARD__LAG_INTERVAL_S", "1.5"),
                ("KILN_DASHBOARD__BOOTSTRAP", "env:9092"),
                ("KILN_DASHBOARD__BROKER__TIMEOUT_S", "4"),
                ("KILN_DASHBOARD__LAG", "false"),
            ]),
        )
        .unwrap();
        assert_eq!(s.lag_interval_s, 0.5, "a flag beats all");
        assert_eq!(s.broker.sasl_user.as_deref(), Some("flag-user"));
        assert_eq!(s.bootstrap, "env:9092", "the environment beats the file");
        assert_eq!(s.broker.timeout_s, 4);
        assert!(!s.lag);
        assert_eq!(s.refresh_s, 30, "the file beats the default");
        assert_eq!(s.broker.tls_ca_file, Some("/file-ca".into()));
        assert_eq!(
            s.broker.sasl_mechanism, "SCRAM-SHA-512",
            "the default stays"
        );
    }

    #[test]
    fn unknown_keys_bad_values_and_missing_files_are_named() {
        let f = file("[broker]\nsasl_pasword = \"x\"\n");
        let err = error(&with_config(&f), &[]);
        assert!(err.contains("sasl_pasword"), "{err}");
        for (var, value) in [
            ("KILN_DASHBOARD__HTTPS__CERT", "/x.crt"),
            ("KILN_DASHBOARD__REFRESH_S", "soon"),
            ("KILN_DASHBOARD__BROKER__TIMEOUT_S", "-1"),
        ] {
            let err = error(&DashboardArgs::default(), &[(var, value)]);
            assert!(err.contains(var), "{err}");
        }
        let err = error(
            &DashboardArgs::default(),
            &[("KILN_DASHBOARD__LAG_INTERVAL_S", "0")],
        );
        assert!(
            err.contains("lag_interval_s") && err.contains("out of range"),
            "{err}"
        );
        let args = DashboardArgs {
            config: Some("/nonexistent/dashboard.toml".into()),
            ..Default::default()
        };
        assert!(error(&args, &[]).contains("does not exist"));
        let err = error(&DashboardArgs::default(), &[("KILN_TLS_CA", "/ca.crt")]);
        assert!(err.contains("KILN_DASHBOARD__BROKER__TLS_CA_FILE"), "{err}");
    }

    #[test]
    fn secrets_never_show_in_debug_and_a_flag_replaces_the_settings_password() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "hunter2-file\n").unwrap();
        let vars = [
            (
                "KILN_DASHBOARD__DATABASE_URL",
                "postgres://kiln:hunter2-db@db/kiln",
            ),
            ("KILN_DASHBOARD__BROKER__SASL_USER", "dashboard"),
            ("KILN_DASHBOARD__BROKER__SASL_PASSWORD", "hunter2-env"),
        ];
        let s = DashboardSettings::load(&DashboardArgs::default(), env(&vars)).unwrap();
        let shown = format!("{s:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("postgres://kiln:***@db/kiln"), "{shown}");
        let sasl = s.broker.security().unwrap().sasl.unwrap();
        assert_eq!(sasl.password, "hunter2-env");
        let args = DashboardArgs {
            sasl_password_file: Some(pw),
            ..Default::default()
        };
        let s = DashboardSettings::load(&args, env(&vars)).unwrap();
        let sasl = s.broker.security().unwrap().sasl.unwrap();
        assert_eq!(sasl.password, "hunter2-file");
    }

    /// The shipped example loads with the real loader.
    #[test]
    fn the_example_file_loads() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/dashboard.example.toml");
        let args = DashboardArgs {
            config: Some(path),
            ..Default::default()
        };
        let s = DashboardSettings::load(&args, env(&[])).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:8081");
        assert!(s.lag && s.broker.sasl_user.is_some());
    }
}
