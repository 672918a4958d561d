//! The playbook loader's view of YAML: saphyr's marked loader (every node with its span),
//! turned into a small located tree the typed readers below walk.
//!
//! Every node keeps its 1-based line, so the loader can name the line of any bad value.
//! Scalars are kept as written (the loader's early parsing is off: `1.10` stays "1.10") and
//! resolved by the reader that asks for a type. Duplicate keys (saphyr refuses them), tags
//! and multiple documents are refused: a playbook is plain data and must mean exactly what it
//! says. Aliases are expanded by the loader under a node budget, as for manifests.

use std::fmt;
use std::ops::RangeInclusive;

use saphyr::{MarkedYaml, ScalarStyle, YamlData, YamlLoader};
use saphyr_parser::Parser;

/// Nesting limit: far above any playbook, far below a stack overflow.
const DEPTH_MAX: usize = 32;
/// Node limit for one document: a playbook has a few hundred at most.
const NODES_MAX: usize = 100_000;
/// Nodes alias expansion may produce (saphyr's loader enforces it while loading).
const ALIAS_NODES_MAX: usize = 10_000;

/// One problem in a playbook, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// 1-based line of the offending key or value.
    pub line: usize,
    /// Dotted path of the field, e.g. `checks[3].max`; empty for document-level problems.
    pub field: String,
    pub reason: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "line {}: {}", self.line, self.reason)
        } else {
            write!(f, "line {}: {}: {}", self.line, self.field, self.reason)
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub line: usize,
    pub value: Value,
}

#[derive(Debug, Clone)]
pub(crate) enum Value {
    /// Text as written; `plain` is false for quoted and block scalars (always strings).
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    /// Entries in document order: (key, key line, value).
    Map(Vec<(String, usize, Node)>),
}

impl Node {
    pub fn kind(&self) -> &'static str {
        match &self.value {
            Value::Scalar { plain: false, .. } => "a string",
            Value::Scalar { text, plain: true } => {
                if is_null(text) {
                    "null"
                } else if parse_int(text).is_some() {
                    "an integer"
                } else if parse_bool(text).is_some() {
                    "a boolean"
                } else if text.parse::<f64>().is_ok() {
                    "a number"
                } else {
                    "a string"
                }
            }
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, plain: true } if is_null(text))
    }
}

fn is_null(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

fn parse_int(text: &str) -> Option<i64> {
    let t = text.strip_prefix('+').unwrap_or(text);
    if t.is_empty() {
        return None;
    }
    let (neg, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
        return None;
    }
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    let v: i64 = clean.parse().ok()?;
    Some(if neg { -v } else { v })
}

/// Parses one YAML document into a located tree.
pub(crate) fn parse(input: &str) -> Result<Node, LoadError> {
    let mut loader: YamlLoader<'_, MarkedYaml<'_>> = YamlLoader::default();
    loader.early_parse(false);
    loader.alias_limit(ALIAS_NODES_MAX);
    let mut parser = Parser::new_from_str(input);
    let scan = |e: &saphyr::ScanError| scan_error(input, e);
    parser.load(&mut loader, true).map_err(|e| scan(&e))?;
    if let Some(e) = loader.error() {
        return Err(scan(e));
    }
    let mut docs = loader.into_documents();
    if docs.len() > 1 {
        return Err(doc_error(
            docs[1].span.start.line(),
            "more than one YAML document",
        ));
    }
    let Some(doc) = docs.pop() else {
        return Err(doc_error(1, "empty playbook: expected a mapping"));
    };
    let mut nodes = 0usize;
    convert(doc, 0, &mut nodes)
}

/// A loader error. A duplicated key is named as a field (the loader says only where it is).
fn scan_error(input: &str, e: &saphyr::ScanError) -> LoadError {
    let line = e.marker().line();
    if e.info().contains("duplicated key") {
        let key = input
            .lines()
            .nth(line.saturating_sub(1))
            .map(|l| l.chars().skip(e.marker().col()).collect::<String>())
            .and_then(|rest| rest.split(':').next().map(str::to_string))
            .map(|k| k.trim().trim_matches(['"', '\'']).to_string())
            .unwrap_or_default();
        return LoadError {
            line,
            field: key,
            reason: "duplicate key".into(),
        };
    }
    LoadError {
        line,
        field: String::new(),
        reason: format!("not valid YAML: {}", e.info()),
    }
}

fn doc_error(line: usize, reason: &str) -> LoadError {
    LoadError {
        line,
        field: String::new(),
        reason: reason.to_string(),
    }
}

const TAGS_REFUSED: &str = "tags (!tag) are not allowed in a playbook";

/// One marked node into the located tree, counting nodes and depth against their limits.
fn convert(node: MarkedYaml<'_>, depth: usize, nodes: &mut usize) -> Result<Node, LoadError> {
    let line = node.span.start.line();
    *nodes += 1;
    if *nodes > NODES_MAX {
        return Err(doc_error(line, "too many YAML nodes for a playbook"));
    }
    if depth > DEPTH_MAX {
        return Err(doc_error(line, "nested too deeply"));
    }
    let value = match node.data {
        YamlData::Representation(_, _, Some(_)) | YamlData::Tagged(..) => {
            return Err(doc_error(line, TAGS_REFUSED))
        }
        YamlData::Representation(text, style, None) => Value::Scalar {
            text: text.into_owned(),
            plain: style == ScalarStyle::Plain,
        },
        // Early parsing is off, so scalars stay representations; a resolved one (the loader
        // resolves none today) is kept as its text.
        YamlData::Value(s) => Value::Scalar {
            text: scalar_text(&s),
            plain: true,
        },
        YamlData::Sequence(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                out.push(convert(item, depth + 1, nodes)?);
            }
            Value::Seq(out)
        }
        YamlData::Mapping(map) => {
            let mut out = Vec::with_capacity(map.len());
            for (k, v) in map {
                let key_line = k.span.start.line();
                let key = match k.data {
                    YamlData::Representation(_, _, Some(_)) => {
                        return Err(doc_error(key_line, TAGS_REFUSED))
                    }
                    YamlData::Representation(text, _, None) => text.into_owned(),
                    YamlData::Value(s) => scalar_text(&s),
                    _ => return Err(doc_error(key_line, "a mapping key must be a plain string")),
                };
                let mut value = convert(v, depth + 1, nodes)?;
                // An empty value's span is where the next token starts: the key's line says more.
                if value.is_null() {
                    value.line = key_line;
                }
                out.push((key, key_line, value));
            }
            Value::Map(out)
        }
        YamlData::Alias(_) | YamlData::BadValue => {
            return Err(doc_error(line, "an unsupported YAML value"))
        }
    };
    Ok(Node { line, value })
}

fn scalar_text(s: &saphyr::Scalar<'_>) -> String {
    match s {
        saphyr::Scalar::Null => String::new(),
        saphyr::Scalar::Boolean(b) => b.to_string(),
        saphyr::Scalar::Integer(i) => i.to_string(),
        saphyr::Scalar::FloatingPoint(f) => f.to_string(),
        saphyr::Scalar::String(s) => s.to_string(),
    }
}

/// Joins a parent path and a child key: `checks[2]` + `max` = `checks[2].max`.
pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// A view of one mapping that hands out typed fields, records every problem with its line,
/// and at `finish` reports keys nobody asked for.
pub(crate) struct Fields<'n> {
    path: String,
    pub line: usize,
    entries: &'n [(String, usize, Node)],
    used: Vec<bool>,
}

impl<'n> Fields<'n> {
    /// `None` (with an error recorded) when the node is not a mapping.
    pub fn of(node: &'n Node, path: &str, errors: &mut Vec<LoadError>) -> Option<Fields<'n>> {
        match &node.value {
            Value::Map(entries) => Some(Fields {
                path: path.to_string(),
                line: node.line,
                entries,
                used: vec![false; entries.len()],
            }),
            _ => {
                errors.push(LoadError {
                    line: node.line,
                    field: path.to_string(),
                    reason: format!("expected a mapping, got {}", node.kind()),
                });
                None
            }
        }
    }

    pub fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// The raw node under `key`, marked as used. A null value counts as absent.
    pub fn take(&mut self, key: &str) -> Option<&'n Node> {
        let i = self.entries.iter().position(|(k, _, _)| k == key)?;
        self.used[i] = true;
        let node = &self.entries[i].2;
        if node.is_null() {
            None
        } else {
            Some(node)
        }
    }

    fn err(&self, errors: &mut Vec<LoadError>, line: usize, key: &str, reason: String) {
        errors.push(LoadError {
            line,
            field: self.path(key),
            reason,
        });
    }

    pub fn missing(&self, key: &str, errors: &mut Vec<LoadError>) {
        self.err(errors, self.line, key, "required field is missing".into());
    }

    pub fn opt_u64(
        &mut self,
        key: &str,
        range: RangeInclusive<u64>,
        errors: &mut Vec<LoadError>,
    ) -> Option<u64> {
        let node = self.take(key)?;
        self.node_u64(node, key, &range, errors)
    }

    pub fn req_u64(
        &mut self,
        key: &str,
        range: RangeInclusive<u64>,
        errors: &mut Vec<LoadError>,
    ) -> Option<u64> {
        match self.take(key) {
            Some(node) => self.node_u64(node, key, &range, errors),
            None => {
                self.missing(key, errors);
                None
            }
        }
    }

    fn node_u64(
        &self,
        node: &Node,
        key: &str,
        range: &RangeInclusive<u64>,
        errors: &mut Vec<LoadError>,
    ) -> Option<u64> {
        let parsed = match &node.value {
            Value::Scalar { text, plain: true } => parse_int(text),
            _ => None,
        };
        let want = format!("an integer from {} to {}", range.start(), range.end());
        match parsed {
            Some(v) if v >= 0 && range.contains(&(v as u64)) => Some(v as u64),
            Some(v) => {
                self.err(
                    errors,
                    node.line,
                    key,
                    format!("out of range: {v}, expected {want}"),
                );
                None
            }
            None => {
                self.err(
                    errors,
                    node.line,
                    key,
                    format!("expected {want}, got {}", describe(node)),
                );
                None
            }
        }
    }

    pub fn opt_bool(&mut self, key: &str, errors: &mut Vec<LoadError>) -> Option<bool> {
        let node = self.take(key)?;
        match &node.value {
            Value::Scalar { text, plain: true } if parse_bool(text).is_some() => parse_bool(text),
            _ => {
                self.err(
                    errors,
                    node.line,
                    key,
                    format!("expected true or false, got {}", describe(node)),
                );
                None
            }
        }
    }

    pub fn opt_str(&mut self, key: &str, errors: &mut Vec<LoadError>) -> Option<String> {
        let node = self.take(key)?;
        self.node_str(node, key, errors)
    }

    pub fn req_str(&mut self, key: &str, errors: &mut Vec<LoadError>) -> Option<String> {
        match self.take(key) {
            Some(node) => self.node_str(node, key, errors),
            None => {
                self.missing(key, errors);
                None
            }
        }
    }

    fn node_str(&self, node: &Node, key: &str, errors: &mut Vec<LoadError>) -> Option<String> {
        match &node.value {
            Value::Scalar { text, .. } if !text.trim().is_empty() => Some(text.clone()),
            Value::Scalar { .. } => {
                self.err(errors, node.line, key, "must not be empty".into());
                None
            }
            _ => {
                self.err(
                    errors,
                    node.line,
                    key,
                    format!("expected a string, got {}", node.kind()),
                );
                None
            }
        }
    }

    /// A string that must be one of `allowed`.
    pub fn opt_choice(
        &mut self,
        key: &str,
        allowed: &[&str],
        errors: &mut Vec<LoadError>,
    ) -> Option<String> {
        let node = self.take(key)?;
        let s = self.node_str(node, key, errors)?;
        if allowed.contains(&s.as_str()) {
            Some(s)
        } else {
            self.err(
                errors,
                node.line,
                key,
                format!(
                    "unknown value {s:?}; expected one of: {}",
                    allowed.join(", ")
                ),
            );
            None
        }
    }

    /// A list of strings; each item, if `allowed` is given, must be one of it.
    pub fn opt_str_list(
        &mut self,
        key: &str,
        allowed: Option<&[&str]>,
        errors: &mut Vec<LoadError>,
    ) -> Option<Vec<String>> {
        let node = self.take(key)?;
        let Value::Seq(items) = &node.value else {
            self.err(
                errors,
                node.line,
                key,
                format!("expected a list of strings, got {}", node.kind()),
            );
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let item_key = format!("{key}[{i}]");
            match &item.value {
                Value::Scalar { text, .. } if !text.trim().is_empty() => {
                    if let Some(allowed) = allowed {
                        if !allowed.contains(&text.as_str()) {
                            self.err(
                                errors,
                                item.line,
                                &item_key,
                                format!(
                                    "unknown value {text:?}; expected one of: {}",
                                    allowed.join(", ")
                                ),
                            );
                            ok = false;
                            continue;
                        }
                    }
                    out.push(text.clone());
                }
                _ => {
                    self.err(
                        errors,
                        item.line,
                        &item_key,
                        format!("expected a non-empty string, got {}", describe(item)),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    pub fn opt_u64_list(
        &mut self,
        key: &str,
        range: RangeInclusive<u64>,
        errors: &mut Vec<LoadError>,
    ) -> Option<Vec<u64>> {
        let node = self.take(key)?;
        let Value::Seq(items) = &node.value else {
            self.err(
                errors,
                node.line,
                key,
                format!("expected a list of integers, got {}", node.kind()),
            );
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            match self.node_u64(item, &format!("{key}[{i}]"), &range, errors) {
                Some(v) => out.push(v),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// A mapping of string to string whose keys, when `allowed_keys` is given, must be in it.
    pub fn opt_str_map(
        &mut self,
        key: &str,
        allowed_keys: Option<&[&str]>,
        errors: &mut Vec<LoadError>,
    ) -> Option<Vec<(String, String)>> {
        let node = self.take(key)?;
        let Value::Map(entries) = &node.value else {
            self.err(
                errors,
                node.line,
                key,
                format!(
                    "expected a mapping of names to strings, got {}",
                    node.kind()
                ),
            );
            return None;
        };
        let mut out = Vec::with_capacity(entries.len());
        let mut ok = true;
        for (k, line, v) in entries {
            let item_key = format!("{key}.{k}");
            if let Some(allowed_keys) = allowed_keys {
                if !allowed_keys.contains(&k.as_str()) {
                    self.err(
                        errors,
                        *line,
                        &item_key,
                        format!("unknown key; expected one of: {}", allowed_keys.join(", ")),
                    );
                    ok = false;
                    continue;
                }
            }
            match &v.value {
                Value::Scalar { text, .. } if !text.trim().is_empty() => {
                    out.push((k.clone(), text.clone()))
                }
                _ => {
                    self.err(
                        errors,
                        v.line,
                        &item_key,
                        format!("expected a non-empty string, got {}", describe(v)),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    /// A mapping of names to integers in `range` (e.g. link speed per interface).
    pub fn opt_u64_map(
        &mut self,
        key: &str,
        range: RangeInclusive<u64>,
        errors: &mut Vec<LoadError>,
    ) -> Option<Vec<(String, u64)>> {
        let node = self.take(key)?;
        let Value::Map(entries) = &node.value else {
            self.err(
                errors,
                node.line,
                key,
                format!(
                    "expected a mapping of names to integers, got {}",
                    node.kind()
                ),
            );
            return None;
        };
        let mut out = Vec::with_capacity(entries.len());
        let mut ok = true;
        for (k, _, v) in entries {
            match self.node_u64(v, &format!("{key}.{k}"), &range, errors) {
                Some(n) => out.push((k.clone(), n)),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// A mapping whose values are mappings, each read by `read` with its own `Fields` (whose
    /// unknown keys `read` reports with `finish`).
    pub fn opt_map_of<T>(
        &mut self,
        key: &str,
        errors: &mut Vec<LoadError>,
        mut read: impl FnMut(&str, Fields<'n>, &mut Vec<LoadError>) -> Option<T>,
    ) -> Option<Vec<(String, T)>> {
        let node = self.take(key)?;
        let Value::Map(entries) = &node.value else {
            self.err(
                errors,
                node.line,
                key,
                format!("expected a mapping, got {}", node.kind()),
            );
            return None;
        };
        let mut out = Vec::with_capacity(entries.len());
        let mut ok = true;
        for (k, _, v) in entries {
            let path = format!("{}.{k}", self.path(key));
            let Some(f) = Fields::of(v, &path, errors) else {
                ok = false;
                continue;
            };
            match read(k, f, errors) {
                Some(t) => out.push((k.clone(), t)),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// Reports every key not taken. `allowed` lists the keys this mapping accepts.
    pub fn finish(self, allowed: &[&str], errors: &mut Vec<LoadError>) {
        for (i, (key, line, _)) in self.entries.iter().enumerate() {
            if !self.used[i] {
                errors.push(LoadError {
                    line: *line,
                    field: join(&self.path, key),
                    reason: format!("unknown field; expected one of: {}", allowed.join(", ")),
                });
            }
        }
    }
}

/// A short description of a value for error messages: `the string "abc"`, `a list`.
fn describe(node: &Node) -> String {
    match &node.value {
        Value::Scalar { text, .. } => format!("{} {:?}", node.kind(), truncate(text, 40)),
        _ => node.kind().to_string(),
    }
}

fn truncate(s: &str, max_chars: usize) -> String {
    if s.chars().count() <= max_chars {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max_chars).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_one_based_and_scalars_kept_as_written() {
        let doc = parse("a: 1\nb:\n  - 1.10\n  - \"x\"\n").expect("valid");
        let Value::Map(entries) = &doc.value else {
            panic!("not a map")
        };
        assert_eq!(entries[0].0, "a");
        assert_eq!(entries[0].1, 1);
        assert_eq!(entries[1].1, 2);
        let Value::Seq(items) = &entries[1].2.value else {
            panic!("not a seq")
        };
        assert_eq!(items[0].line, 3);
        assert!(matches!(&items[0].value, Value::Scalar { text, plain: true } if text == "1.10"));
        assert!(matches!(&items[1].value, Value::Scalar { text, plain: false } if text == "x"));
    }

    #[test]
    fn duplicate_keys_tags_and_two_documents_are_refused() {
        let e = parse("a: 1\nb: 2\na: 3\n").expect_err("duplicate");
        assert_eq!((e.line, e.field.as_str()), (3, "a"));
        assert!(e.reason.contains("duplicate"), "{e}");
        let e = parse("x:\n  - k: 1\n    k: 2\n").expect_err("nested duplicate");
        assert_eq!((e.line, e.field.as_str()), (3, "k"));
        let e = parse("a: !!str 1\n").expect_err("tag");
        assert_eq!(e.line, 1);
        assert!(e.reason.contains("tags"), "{e}");
        let e = parse("a: 1\n---\nb: 2\n").expect_err("two docs");
        assert!(e.reason.contains("more than one"), "{e}");
        let e = parse("a: [1, 2\n").expect_err("bad yaml");
        assert!(e.reason.contains("not valid YAML"), "{e}");
    }

    #[test]
    fn aliases_expand_within_their_budget() {
        let doc = parse("a: &x [1, 2]\nb: *x\n").expect("alias");
        let Value::Map(entries) = &doc.value else {
            panic!("not a map")
        };
        assert!(matches!(&entries[1].2.value, Value::Seq(items) if items.len() == 2));
        // Each level doubles the one before: 2^20 nodes, far past the budget.
        let mut bomb = String::from("l0: &l0 [x, x]\n");
        for i in 1..=20 {
            bomb.push_str(&format!("l{i}: &l{i} [*l{p}, *l{p}]\n", p = i - 1));
        }
        let e = parse(&bomb).expect_err("alias bomb");
        assert!(e.reason.contains("not valid YAML"), "{e}");
    }

    #[test]
    fn empty_values_take_their_key_line() {
        let doc = parse("a:\nb: 1\n").expect("valid");
        let Value::Map(entries) = &doc.value else {
            panic!("not a map")
        };
        assert!(entries[0].2.is_null());
        assert_eq!(entries[0].2.line, 1);
    }

    #[test]
    fn ints_parse_strictly() {
        assert_eq!(parse_int("10"), Some(10));
        assert_eq!(parse_int("-3"), Some(-3));
        assert_eq!(parse_int("1_000"), Some(1000));
        assert_eq!(parse_int("1.5"), None);
        assert_eq!(parse_int("ten"), None);
        assert_eq!(parse_int(""), None);
    }
}
