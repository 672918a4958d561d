//! Field rules, shared by every format. Each rule returns the reason a value is refused.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::raw::{RawItem, RawValue};
use crate::{FieldError, Manifest, ManifestErrors, NodeSpec, FIELDS, GPU_COUNT_MAX, MAX_ERRORS};

const HOSTNAME_LEN_MAX: usize = 253;
const HOST_LABEL_LEN_MAX: usize = 63;
const RACK_LEN_MAX: usize = 64;
const TEXT_LEN_MAX: usize = 128;
const LABEL_KEY_LEN_MAX: usize = 63;
const LABEL_VALUE_LEN_MAX: usize = 256;
const LABELS_MAX: usize = 64;

pub(crate) fn validate_all(
    items: &[RawItem],
    expected_rack: Option<&str>,
) -> Result<Manifest, ManifestErrors> {
    let mut errors = Vec::new();
    let mut omitted = 0usize;
    let mut push = |e: FieldError, errors: &mut Vec<FieldError>| {
        if errors.len() < MAX_ERRORS {
            errors.push(e);
        } else {
            omitted += 1;
        }
    };
    if items.is_empty() {
        return Err(ManifestErrors::document(
            None,
            "the manifest lists no nodes",
        ));
    }
    let mut nodes = Vec::with_capacity(items.len());
    // hostname -> (line, item) of its first appearance.
    let mut seen: HashMap<String, (Option<u64>, usize)> = HashMap::with_capacity(items.len());
    for item in items {
        let mut item_errors: Vec<(String, Option<u64>, String)> = Vec::new();
        let (node, hostname) = validate_item(item, expected_rack, &mut item_errors);
        if let Some(hostname) = hostname {
            match seen.get(&hostname) {
                Some((line, first)) => {
                    let hostname_line = field_line(item, "hostname");
                    let at = match line {
                        Some(l) => format!("line {l} (node {first})"),
                        None => format!("node {first}"),
                    };
                    item_errors.push((
                        "hostname".into(),
                        hostname_line,
                        format!("duplicate hostname {hostname:?}: already listed at {at}"),
                    ));
                }
                None => {
                    seen.insert(hostname, (item.line, item.item));
                }
            }
        }
        for (field, line, reason) in item_errors {
            let e = FieldError {
                line: line.or(item.line),
                item: Some(item.item),
                field,
                reason,
            };
            push(e, &mut errors);
        }
        if let Some(node) = node {
            nodes.push(node);
        }
    }
    if errors.is_empty() && omitted == 0 {
        Ok(Manifest { nodes })
    } else {
        Err(ManifestErrors { errors, omitted })
    }
}

fn field_line(item: &RawItem, name: &str) -> Option<u64> {
    item.fields
        .iter()
        .find(|f| f.name == name)
        .and_then(|f| f.line)
}

/// Validates one item; pushes (field, line, reason) for each problem; returns the node when
/// there were none, and the (normalised) hostname whenever it is valid.
fn validate_item(
    item: &RawItem,
    expected_rack: Option<&str>,
    errors: &mut Vec<(String, Option<u64>, String)>,
) -> (Option<NodeSpec>, Option<String>) {
    let before = errors.len();
    for (field, reason) in &item.errors {
        errors.push((field.clone(), None, reason.clone()));
    }
    if item.fields.is_empty() && !item.errors.is_empty() {
        return (None, None); // not a node at all: its missing fields would only be noise
    }
    let mut values: BTreeMap<&str, (&RawValue, Option<u64>)> = BTreeMap::new();
    for f in &item.fields {
        match FIELDS.iter().find(|k| **k == f.name) {
            None => errors.push((
                f.name.clone(),
                f.line,
                format!("unknown field (expected fields: {})", FIELDS.join(", ")),
            )),
            Some(k) => {
                if values.insert(k, (&f.value, f.line)).is_some() {
                    errors.push((f.name.clone(), f.line, "field appears twice".into()));
                }
            }
        }
    }
    let mut text = |name: &str, required: bool, check: &dyn Fn(&str) -> Result<(), String>| {
        let (value, line) = values
            .get(name)
            .copied()
            .unwrap_or((&RawValue::Missing, None));
        match value {
            RawValue::Missing if required => {
                errors.push((name.into(), line, "missing (required)".into()));
                None
            }
            RawValue::Missing => Some(String::new()),
            RawValue::Text(s) if !required && s.trim().is_empty() => Some(String::new()),
            RawValue::Text(s) => {
                let s = s.trim();
                match check(s) {
                    Ok(()) => Some(s.to_string()),
                    Err(reason) => {
                        errors.push((name.into(), line, reason));
                        None
                    }
                }
            }
            RawValue::Number(n) => {
                errors.push((
                    name.into(),
                    line,
                    format!("must be a string, got the number {n} (quote it: \"{n}\")"),
                ));
                None
            }
            other => {
                errors.push((
                    name.into(),
                    line,
                    format!("must be a string, got {}", other.kind()),
                ));
                None
            }
        }
    };

    let hostname =
        text("hostname", true, &|s| validate_hostname(s)).map(|h| h.to_ascii_lowercase());
    let rack = text("rack", true, &|s| {
        validate_rack(s)?;
        match expected_rack {
            Some(want) if want != s => Err(format!(
                "rack {s:?} does not match the rack this manifest was sent for ({want:?})"
            )),
            _ => Ok(()),
        }
    });
    let bmc_address = text("bmc_address", true, &|s| validate_bmc_address(s));
    let firmware_bmc = text("firmware_bmc", true, &firmware_rule);
    let firmware_bios = text("firmware_bios", true, &firmware_rule);
    let firmware_gpu_vbios = text("firmware_gpu_vbios", true, &firmware_rule);
    let firmware_nic = text("firmware_nic", true, &firmware_rule);
    let gpu_model_raw = text("gpu_model", false, &|s| text_rule(s, "GPU model"));

    let gpu_count = {
        let (value, line) = values
            .get("gpu_count")
            .copied()
            .unwrap_or((&RawValue::Missing, None));
        let parsed = match value {
            RawValue::Missing => Err("missing (required)".to_string()),
            RawValue::Text(s) | RawValue::Number(s) => parse_gpu_count(s.trim()),
            other => Err(format!(
                "must be a whole number from 0 to {GPU_COUNT_MAX}, got {}",
                other.kind()
            )),
        };
        match parsed {
            Ok(n) => Some(n),
            Err(reason) => {
                errors.push(("gpu_count".into(), line, reason));
                None
            }
        }
    };
    let gpu_model = match (gpu_model_raw, gpu_count) {
        (Some(model), Some(count)) if count > 0 && model.is_empty() => {
            let line = values.get("gpu_model").and_then(|(_, l)| *l);
            errors.push((
                "gpu_model".into(),
                line,
                format!("required when gpu_count is {count} (more than 0)"),
            ));
            None
        }
        (model, _) => model,
    };
    let labels = {
        let (value, line) = values
            .get("labels")
            .copied()
            .unwrap_or((&RawValue::Missing, None));
        match parse_labels(value) {
            Ok(l) => Some(l),
            Err((reason, value_line)) => {
                errors.push(("labels".into(), value_line.or(line), reason));
                None
            }
        }
    };

    if errors.len() > before {
        return (None, hostname);
    }
    let node = (|| {
        Some(NodeSpec {
            hostname: hostname.clone()?,
            rack: rack?,
            bmc_address: bmc_address?,
            gpu_model: gpu_model?,
            gpu_count: gpu_count?,
            firmware_bmc: firmware_bmc?,
            firmware_bios: firmware_bios?,
            firmware_gpu_vbios: firmware_gpu_vbios?,
            firmware_nic: firmware_nic?,
            labels: labels?,
        })
    })();
    (node, hostname)
}

fn parse_gpu_count(s: &str) -> Result<u8, String> {
    let bad = || format!("must be a whole number from 0 to {GPU_COUNT_MAX}, got {s:?}");
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match s.parse::<u32>() {
        Ok(n) if n <= u32::from(GPU_COUNT_MAX) => Ok(n as u8),
        _ => Err(bad()),
    }
}

fn firmware_rule(s: &str) -> Result<(), String> {
    text_rule(s, "firmware version")
}

fn text_rule(s: &str, what: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    if s.chars().count() > TEXT_LEN_MAX {
        return Err(format!("{what} longer than {TEXT_LEN_MAX} characters"));
    }
    if s.chars().any(char::is_control) {
        return Err(format!("{what} contains a control character"));
    }
    Ok(())
}

/// RFC 1123 host name: dot-separated labels of 1-63 letters, digits and hyphens, not starting
/// or ending with a hyphen, at most 253 characters in all, no trailing dot.
pub fn validate_hostname(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("hostname must not be empty".into());
    }
    if s.len() > HOSTNAME_LEN_MAX {
        return Err(format!("longer than {HOSTNAME_LEN_MAX} characters"));
    }
    for label in s.split('.') {
        if label.is_empty() {
            return Err(format!(
                "{s:?} is not an RFC 1123 host name: empty label (two dots, or a dot at an end)"
            ));
        }
        if label.len() > HOST_LABEL_LEN_MAX {
            return Err(format!(
                "{s:?} is not an RFC 1123 host name: label {label:?} longer than {HOST_LABEL_LEN_MAX} characters"
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(format!(
                "{s:?} is not an RFC 1123 host name: {c:?} is not a letter, digit or hyphen"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "{s:?} is not an RFC 1123 host name: label {label:?} starts or ends with a hyphen"
            ));
        }
    }
    Ok(())
}

/// Rack names are Kafka keys, URL path segments and database keys: 1-64 letters, digits,
/// `.`, `_` or `-`.
pub fn validate_rack(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("rack must not be empty".into());
    }
    if s.len() > RACK_LEN_MAX {
        return Err(format!("rack name longer than {RACK_LEN_MAX} characters"));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "rack {s:?}: {c:?} is not allowed (letters, digits, '.', '_' and '-' only)"
        ));
    }
    Ok(())
}

/// A BMC address: `host`, `host:port`, `ipv4[:port]`, `[ipv6][:port]`, a bare IPv6 address,
/// or an `https://` URL with such a host. Plain `http://` and other schemes are refused:
/// Redfish is spoken over HTTPS.
pub fn validate_bmc_address(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("BMC address must not be empty".into());
    }
    let lower = s.to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix("https://") {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return Err(format!(
                "{s:?}: credentials do not belong in the BMC address"
            ));
        }
        if authority.is_empty() {
            return Err(format!("{s:?}: the URL has no host"));
        }
        return host_port(authority).map_err(|r| format!("{s:?}: {r}"));
    }
    if let Some((scheme, _)) = lower.split_once("://") {
        return Err(format!(
            "{s:?}: scheme {scheme:?} not accepted (use host[:port] or an https:// URL)"
        ));
    }
    host_port(s).map_err(|r| format!("{s:?} is not a host, IP[:port] or https URL: {r}"))
}

fn host_port(s: &str) -> Result<(), String> {
    if s.parse::<Ipv6Addr>().is_ok() {
        return Ok(());
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return Err("'[' without a closing ']'".into());
        };
        if v6.parse::<Ipv6Addr>().is_err() {
            return Err(format!("{v6:?} is not an IPv6 address"));
        }
        match after {
            "" => return Ok(()),
            _ => match after.strip_prefix(':') {
                Some(port) => (None, Some(port)),
                None => return Err("unexpected text after ']'".into()),
            },
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(s), None),
        }
    };
    if let Some(port) = port {
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(format!("port {port:?} is not a number from 1 to 65535")),
        }
    }
    if let Some(host) = host {
        let looks_ipv4 = host
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if looks_ipv4 {
            if host.parse::<Ipv4Addr>().is_err() {
                return Err(format!("{host:?} is not an IPv4 address"));
            }
        } else {
            validate_hostname(host)?;
        }
    }
    Ok(())
}

/// Labels: a map of strings, or the CSV form `key=value;key=value`.
fn parse_labels(value: &RawValue) -> Result<BTreeMap<String, String>, (String, Option<u64>)> {
    let mut out = BTreeMap::new();
    let mut add = |k: &str, v: &str, line: Option<u64>| -> Result<(), (String, Option<u64>)> {
        let (k, v) = (k.trim(), v.trim());
        check_label(k, v).map_err(|r| (r, line))?;
        if out.insert(k.to_string(), v.to_string()).is_some() {
            return Err((format!("label {k:?} given twice"), line));
        }
        if out.len() > LABELS_MAX {
            return Err((format!("more than {LABELS_MAX} labels"), line));
        }
        Ok(())
    };
    match value {
        RawValue::Missing => {}
        RawValue::Text(s) => {
            for pair in s.split(';').filter(|p| !p.trim().is_empty()) {
                let Some((k, v)) = pair.split_once('=') else {
                    return Err((
                        format!("{pair:?} is not key=value (labels are key=value;key=value)"),
                        None,
                    ));
                };
                add(k, v, None)?;
            }
        }
        RawValue::Map(entries) => {
            for (k, v, line) in entries {
                let Some(text) = v.scalar_text() else {
                    return Err((
                        format!("label {k:?} must be a string, got {}", v.kind()),
                        *line,
                    ));
                };
                add(k, &text, *line)?;
            }
        }
        other => {
            return Err((
                format!(
                    "must be a map of key: value or \"key=value;key=value\", got {}",
                    other.kind()
                ),
                None,
            ))
        }
    }
    Ok(out)
}

fn check_label(k: &str, v: &str) -> Result<(), String> {
    if k.is_empty() || k.len() > LABEL_KEY_LEN_MAX {
        return Err(format!(
            "label key {k:?} must be 1 to {LABEL_KEY_LEN_MAX} characters"
        ));
    }
    if let Some(c) = k
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')))
    {
        return Err(format!(
            "label key {k:?}: {c:?} is not allowed (letters, digits, '.', '_', '-', '/')"
        ));
    }
    if v.chars().count() > LABEL_VALUE_LEN_MAX {
        return Err(format!(
            "label {k:?}: value longer than {LABEL_VALUE_LEN_MAX} characters"
        ));
    }
    if let Some(c) = v.chars().find(|c| c.is_control() || *c == ';') {
        return Err(format!("label {k:?}: value contains {c:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames() {
        for ok in ["a", "gpu-a-01", "n1.rack7.dc.example.com", "A1", "0abc"] {
            assert_eq!(validate_hostname(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "a..b",
            "a.",
            ".a",
            "a_b",
            "a b",
            "ä",
            &"x".repeat(64),
        ] {
            assert!(validate_hostname(bad).is_err(), "{bad:?} accepted");
        }
        let long = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(62),
        ]
        .join(".");
        assert_eq!(long.len(), 254);
        assert!(validate_hostname(&long).is_err());
    }

    #[test]
    fn bmc_addresses() {
        for ok in [
            "10.0.0.1",
            "10.0.0.1:443",
            "bmc-a-01",
            "bmc-a-01.mgmt:8443",
            "fe80::1",
            "[fe80::1]",
            "[fe80::1]:443",
            "https://10.0.0.1",
            "https://bmc-a-01:8443/redfish/v1",
            "HTTPS://BMC",
        ] {
            assert_eq!(validate_bmc_address(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "http://10.0.0.1",
            "ftp://x",
            "10.0.0.1:0",
            "10.0.0.1:70000",
            "10.0.0.1:abc",
            "300.1.1.1",
            "bmc_a",
            "https://",
            "https://user:pw@bmc",
            "[fe80::1",
            "[zz::1]:443",
            "host:",
        ] {
            assert!(validate_bmc_address(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn racks_and_counts() {
        assert!(validate_rack("r-12.a_b").is_ok());
        for bad in ["", "a b", "a/b", &"r".repeat(65)] {
            assert!(validate_rack(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_gpu_count("0"), Ok(0));
        assert_eq!(parse_gpu_count("16"), Ok(16));
        for bad in ["17", "-1", "8.0", "eight", "", "1e1", "99999999999"] {
            assert!(parse_gpu_count(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn labels() {
        let ok = parse_labels(&RawValue::Text("row=3; pod = p1;".into())).expect("valid");
        assert_eq!(ok.get("row").map(String::as_str), Some("3"));
        assert_eq!(ok.get("pod").map(String::as_str), Some("p1"));
        assert!(parse_labels(&RawValue::Text("row".into())).is_err());
        assert!(parse_labels(&RawValue::Text("a=1;a=2".into())).is_err());
        assert!(parse_labels(&RawValue::Text("bad key=1".into())).is_err());
        assert!(parse_labels(&RawValue::Other("a list")).is_err());
    }
}
