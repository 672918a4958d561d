//! Topic names and per-topic settings, validated with messages that say which value is wrong.

use std::collections::BTreeMap;

use crate::config::LogSettings;

/// The smallest segment a partition may have: a segment's 4 KiB header plus room for its
/// entries (kiln-log refuses less than the header and one batch).
pub const SEGMENT_BYTES_MIN: u64 = 8192;

/// Kafka's own limit, kept so names stay portable to a Kafka cluster.
pub const TOPIC_NAME_LEN_MAX: usize = 249;

/// Partitions one topic may have; a bound on what one request can make the broker open.
pub const PARTITIONS_PER_TOPIC_MAX: u32 = 10_000;

pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("topic name is empty".into());
    }
    if name == "." || name == ".." {
        return Err(format!("topic name {name:?} is not allowed"));
    }
    if name.len() > TOPIC_NAME_LEN_MAX {
        return Err(format!(
            "topic name is {} characters, the limit is {TOPIC_NAME_LEN_MAX}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "topic name {name:?} contains {bad:?}; only ASCII letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    Ok(())
}

/// Settings a topic may override, by their Kafka names.
pub const TOPIC_CONFIG_KEYS: &[&str] = &[
    "cleanup.policy",
    "retention.ms",
    "retention.bytes",
    "segment.bytes",
    "segment.ms",
    "index.interval.bytes",
    "max.message.bytes",
];

/// The topic configs whose values are comma-separated lists (IncrementalAlterConfigs'
/// APPEND and SUBTRACT apply to these only).
pub const LIST_CONFIG_KEYS: &[&str] = &["cleanup.policy"];

/// Every key of [`TOPIC_CONFIG_KEYS`] with its effective value, in that order (DescribeConfigs).
pub fn effective(settings: &TopicSettings) -> Vec<(&'static str, String)> {
    let log = &settings.log;
    let values = [
        "delete".to_string(),
        log.retention_ms.to_string(),
        log.retention_bytes.to_string(),
        log.segment_bytes.to_string(),
        log.segment_ms.to_string(),
        log.index_interval_bytes.to_string(),
        settings.max_batch_bytes.to_string(),
    ];
    TOPIC_CONFIG_KEYS.iter().copied().zip(values).collect()
}

/// A topic's effective settings: broker defaults with the topic's overrides applied.
#[derive(Debug, Clone)]
pub struct TopicSettings {
    pub log: LogSettings,
    pub max_batch_bytes: usize,
}

/// Applies overrides to defaults, refusing unknown keys and bad values.
pub fn resolve(
    defaults: &LogSettings,
    default_max_batch_bytes: usize,
    overrides: &BTreeMap<String, String>,
) -> Result<TopicSettings, String> {
    let mut log = defaults.clone();
    let mut max_batch_bytes = default_max_batch_bytes;
    for (key, value) in overrides {
        let number = || -> Result<i64, String> {
            value
                .parse::<i64>()
                .map_err(|_| format!("{key}={value:?} is not an integer"))
        };
        let positive = || -> Result<u64, String> {
            let n = number()?;
            u64::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{key}={value} must be greater than 0"))
        };
        // Kafka uses -1 for "no limit" on retention.
        let limit = || -> Result<i64, String> {
            match number()? {
                n if n == -1 || n > 0 => Ok(n),
                n => Err(format!(
                    "{key}={n} must be -1 (unlimited) or greater than 0"
                )),
            }
        };
        match key.as_str() {
            "cleanup.policy" if value == "delete" => {}
            "cleanup.policy" => {
                return Err(format!(
                    "cleanup.policy={value:?} is not supported; Kiln deletes by retention only (\"delete\")"
                ))
            }
            "retention.ms" => log.retention_ms = limit()?,
            "retention.bytes" => log.retention_bytes = limit()?,
            "segment.bytes" => {
                let n = positive()?;
                if !(SEGMENT_BYTES_MIN..=u64::from(u32::MAX)).contains(&n) {
                    return Err(format!(
                        "segment.bytes={n} must be between {SEGMENT_BYTES_MIN} and {}",
                        u32::MAX
                    ));
                }
                log.segment_bytes = n;
            }
            "segment.ms" => log.segment_ms = positive()?,
            "index.interval.bytes" => {
                log.index_interval_bytes = u32::try_from(positive()?)
                    .map_err(|_| format!("index.interval.bytes={value} is too large"))?
            }
            "max.message.bytes" => {
                max_batch_bytes = usize::try_from(positive()?)
                    .map_err(|_| format!("max.message.bytes={value} is too large"))?
            }
            _ => {
                return Err(format!(
                    "unknown topic config {key:?}; supported: {}",
                    TOPIC_CONFIG_KEYS.join(", ")
                ))
            }
        }
    }
    Ok(TopicSettings {
        log,
        max_batch_bytes,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names() {
        assert!(validate_topic_name("kiln.nodes").is_ok());
        assert!(validate_topic_name("a-b_c.9").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a/b").unwrap_err().contains("'/'"));
        assert!(validate_topic_name(&"x".repeat(250)).is_err());
    }

    #[test]
    fn every_key_has_an_effective_value() {
        let s = resolve(&LogSettings::default(), 100, &BTreeMap::new()).unwrap();
        let e = effective(&s);
        assert_eq!(e.len(), TOPIC_CONFIG_KEYS.len());
        assert!(e.contains(&("max.message.bytes", "100".to_string())));
        // Every effective value is one `resolve` takes back.
        let all: BTreeMap<String, String> =
            e.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        assert!(resolve(&LogSettings::default(), 100, &all).is_ok());
    }

    #[test]
    fn overrides() {
        let defaults = LogSettings::default();
        let mut o = BTreeMap::new();
        o.insert("retention.ms".to_string(), "-1".to_string());
        o.insert("segment.bytes".to_string(), "1048576".to_string());
        let s = resolve(&defaults, 100, &o).expect("valid");
        assert_eq!(s.log.retention_ms, -1);
        assert_eq!(s.log.segment_bytes, 1048576);
        let mut small = BTreeMap::new();
        small.insert("segment.bytes".to_string(), "4096".to_string());
        let refused = resolve(&LogSettings::default(), 1 << 20, &small)
            .err()
            .unwrap_or_default();
        assert!(refused.contains("between 8192"), "{refused}");

        o.insert("retention.ms".to_string(), "soon".to_string());
        assert!(resolve(&defaults, 100, &o)
            .unwrap_err()
            .contains("retention.ms"));
        let mut bad = BTreeMap::new();
        bad.insert("compression.typo".to_string(), "x".to_string());
        assert!(resolve(&defaults, 100, &bad)
            .unwrap_err()
            .contains("unknown topic config"));
        let mut compact = BTreeMap::new();
        compact.insert("cleanup.policy".to_string(), "compact".to_string());
        assert!(resolve(&defaults, 100, &compact).is_err());
    }
}
