//! Broker settings: `kiln_settings::load` (defaults, the TOML file, then
//! `KILN_BROKER__<SECTION>__<KEY>` variables, e.g. `KILN_BROKER__LOG__RETENTION_MS=3600000`),
//! then flags; and what every service's flags-over-settings step shares (`over`,
//! `over_some`, and the tests' `test_support`).

use anyhow::Context;
use kiln_broker::BrokerConfig;
use kiln_settings::Service;

use crate::broker_cmd::BrokerArgs;

pub fn broker_config(args: &BrokerArgs) -> anyhow::Result<BrokerConfig> {
    broker_config_from(args, std::env::vars())
}

/// A flag that was given replaces its setting.
pub fn over<T: Clone>(setting: &mut T, flag: &Option<T>) {
    if let Some(v) = flag {
        *setting = v.clone();
    }
}

/// A flag that was given replaces its optional setting.
pub fn over_some<T: Clone>(setting: &mut Option<T>, flag: &Option<T>) {
    if flag.is_some() {
        setting.clone_from(flag);
    }
}

fn broker_config_from(
    args: &BrokerArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<BrokerConfig> {
    let mut config: BrokerConfig =
        kiln_settings::load(Service::Broker, args.config.as_deref(), env)
            .context("reading broker settings")?;
    over(&mut config.listen, &args.listen);
    over_some(&mut config.advertised_address, &args.advertised_address);
    over(&mut config.data_dir, &args.data_dir);
    over(&mut config.node_id, &args.node_id);
    if args.auto_create_topics {
        config.auto_create_topics = true;
    }
    config.validate().map_err(anyhow::Error::msg)?;
    Ok(config)
}

/// What the settings tests of every service share.
#[cfg(test)]
pub mod test_support {
    #![allow(clippy::unwrap_used)]
    use std::io::Write;

    /// Variables as `std::env::vars` gives them.
    pub fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A settings file holding `text`, removed when dropped.
    pub fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::test_support::env;
    use super::*;
    use std::io::Write;

    #[test]
    fn defaults_need_no_file() {
        let c = broker_config_from(&BrokerArgs::default(), env(&[])).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:9092");
        assert_eq!(c.node_id, 0);
        assert!(!c.auto_create_topics);
    }

    #[test]
    fn file_then_env_then_flags() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "node_id = 3\ndefault_partitions = 4\n[log]\nretention_ms = 1000"
        )
        .unwrap();
        let args = BrokerArgs {
            config: Some(file.path().to_path_buf()),
            node_id: Some(7),
            ..Default::default()
        };
        let c = broker_config_from(
            &args,
            env(&[
                ("KILN_BROKER__DEFAULT_PARTITIONS", "6"),
                ("KILN_BROKER__LOG__SEGMENT_BYTES", "65536"),
                ("KILN_BOOTSTRAP", "ignored:1"),
            ]),
        )
        .unwrap();
        assert_eq!(c.node_id, 7, "flag wins");
        assert_eq!(c.default_partitions, 6, "env beats file");
        assert_eq!(c.log.retention_ms, 1000, "file beats default");
        assert_eq!(c.log.segment_bytes, 65536);
    }

    #[test]
    fn unknown_file_key_is_an_error_that_names_it() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "lisen = \"127.0.0.1:1\"").unwrap();
        let args = BrokerArgs {
            config: Some(file.path().to_path_buf()),
            ..Default::default()
        };
        let err = format!("{:#}", broker_config_from(&args, env(&[])).unwrap_err());
        assert!(err.contains("lisen"), "{err}");
    }

    /// The shipped example must stay loadable and equal to the built-in defaults.
    #[test]
    fn example_file_matches_defaults() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/broker.example.toml");
        let args = BrokerArgs {
            config: Some(path),
            ..Default::default()
        };
        let from_file = broker_config_from(&args, env(&[])).unwrap();
        assert_eq!(
            serde_json::to_value(&from_file).unwrap(),
            serde_json::to_value(BrokerConfig::default()).unwrap()
        );
    }

    /// Every broker and agent config shipped under deploy/ loads with the real loaders.
    #[test]
    fn shipped_deploy_configs_load() {
        let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
        let mut files = vec![deploy.join("agent.example.toml")];
        for n in 1..=3 {
            files.push(deploy.join(format!("cluster/broker-{n}.toml")));
        }
        let (mut brokers, mut agents) = (0, 0);
        for path in files {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if let Some(n) = name.strip_prefix("broker-") {
                let args = BrokerArgs {
                    config: Some(path.clone()),
                    ..Default::default()
                };
                let c = broker_config_from(&args, env(&[]))
                    .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
                let n: i32 = n.trim_end_matches(".toml").parse().unwrap();
                assert_eq!(c.node_id, n);
                assert_eq!(
                    c.advertised_address.as_deref(),
                    Some(format!("broker-{n}.kiln.example.net:9092").as_str())
                );
                assert_eq!(c.data_dir, std::path::PathBuf::from("/var/lib/kiln/broker"));
                assert_eq!(
                    c.metrics_address().unwrap(),
                    Some("0.0.0.0:9644".parse().unwrap())
                );
                brokers += 1;
            } else {
                let c = kiln_agent::AgentConfig::load(&path)
                    .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
                assert_eq!(c.agent_id, "bastion-1");
                assert_eq!(c.group, "burnin");
                assert_eq!(c.metrics_listen, "0.0.0.0:9645");
                agents += 1;
            }
        }
        assert_eq!((brokers, agents), (3, 1));
    }

    #[test]
    fn a_variable_of_the_earlier_scheme_is_refused_with_its_new_name() {
        let err = format!(
            "{:#}",
            broker_config_from(
                &BrokerArgs::default(),
                env(&[("KILN_LOG__RETENTION_MS", "1")])
            )
            .unwrap_err()
        );
        assert!(err.contains("KILN_BROKER__LOG__RETENTION_MS"), "{err}");
    }

    #[test]
    fn missing_file_is_an_error() {
        let args = BrokerArgs {
            config: Some("/nonexistent/kiln.toml".into()),
            ..Default::default()
        };
        assert!(broker_config_from(&args, env(&[])).is_err());
    }
}
