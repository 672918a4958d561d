//! A small located YAML tree for the playbook loader, built from saphyr-parser's events.
//!
//! Every node keeps its 1-based line, so the loader can name the line of any bad value.
//! Scalars are kept as written (`1.10` stays "1.10") and resolved by the reader that asks
//! for a type. Duplicate keys, anchors/aliases, tags and multiple documents are refused:
//! a playbook is plain data and must mean exactly what it says.

use std::fmt;
use std::ops::RangeInclusive;

use saphyr_parser::{Event, Parser, ScalarStyle};

/// Nesting limit: far above any playbook, far below a stack overflow.
const DEPTH_MAX: usize = 32;
/// Node limit for one document: a playbook has a few hundred at most.
const NODES_MAX: usize = 100_000;

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
    let mut builder = Builder::default();
    let mut docs = 0usize;
    for item in Parser::new_from_str(input) {
        let (event, span) = item.map_err(|e| LoadError {
            line: e.marker().line(),
            field: String::new(),
            reason: format!("not valid YAML: {}", e.info()),
        })?;
        let line = span.start.line();
        match event {
            Event::StreamStart | Event::StreamEnd | Event::Nothing | Event::DocumentEnd => {}
            Event::DocumentStart(_) => {
                docs += 1;
                if docs > 1 {
                    return Err(doc_error(line, "more than one YAML document"));
                }
            }
            Event::Alias(_) => {
                return Err(doc_error(
                    line,
                    "aliases (*name) are not allowed in a playbook",
                ));
            }
            Event::Scalar(text, style, anchor, tag) => {
                reject_anchor_tag(line, anchor, tag.is_some())?;
                let plain = matches!(style, ScalarStyle::Plain);
                builder.push(Node {
                    line,
                    value: Value::Scalar {
                        text: text.into_owned(),
                        plain,
                    },
                })?;
            }
            Event::SequenceStart(anchor, tag) => {
                reject_anchor_tag(line, anchor, tag.is_some())?;
                builder.open(line, Open::Seq(Vec::new()))?;
            }
            Event::MappingStart(anchor, tag) => {
                reject_anchor_tag(line, anchor, tag.is_some())?;
                builder.open(line, Open::Map(Vec::new(), None))?;
            }
            Event::SequenceEnd | Event::MappingEnd => builder.close()?,
        }
    }
    builder
        .root
        .ok_or_else(|| doc_error(1, "empty playbook: expected a mapping"))
}

fn doc_error(line: usize, reason: &str) -> LoadError {
    LoadError {
        line,
        field: String::new(),
        reason: reason.to_string(),
    }
}

fn reject_anchor_tag(line: usize, anchor: usize, tagged: bool) -> Result<(), LoadError> {
    if anchor != 0 {
        return Err(doc_error(
            line,
            "anchors (&name) are not allowed in a playbook",
        ));
    }
    if tagged {
        return Err(doc_error(line, "tags (!tag) are not allowed in a playbook"));
    }
    Ok(())
}

enum Open {
    Seq(Vec<Node>),
    /// Entries so far, and a key waiting for its value.
    Map(Vec<(String, usize, Node)>, Option<(String, usize)>),
}

#[derive(Default)]
struct Builder {
    stack: Vec<(usize, Open)>,
    root: Option<Node>,
    nodes: usize,
}

impl Builder {
    fn open(&mut self, line: usize, open: Open) -> Result<(), LoadError> {
        if self.stack.len() >= DEPTH_MAX {
            return Err(doc_error(line, "nested too deeply"));
        }
        self.stack.push((line, open));
        Ok(())
    }

    fn close(&mut self) -> Result<(), LoadError> {
        let Some((line, open)) = self.stack.pop() else {
            return Err(doc_error(0, "unbalanced YAML events"));
        };
        let value = match open {
            Open::Seq(items) => Value::Seq(items),
            Open::Map(entries, _) => Value::Map(entries),
        };
        self.push(Node { line, value })
    }

    fn push(&mut self, node: Node) -> Result<(), LoadError> {
        self.nodes += 1;
        if self.nodes > NODES_MAX {
            return Err(doc_error(node.line, "too many YAML nodes for a playbook"));
        }
        match self.stack.last_mut() {
            None => {
                self.root = Some(node);
                Ok(())
            }
            Some((_, Open::Seq(items))) => {
                items.push(node);
                Ok(())
            }
            Some((_, Open::Map(entries, pending))) => match pending.take() {
                Some((key, key_line)) => {
                    entries.push((key, key_line, node));
                    Ok(())
                }
                None => {
                    let key = match node.value {
                        Value::Scalar { text, .. } => text,
                        _ => {
                            return Err(doc_error(
                                node.line,
                                "a mapping key must be a plain string",
                            ))
                        }
                    };
                    if entries.iter().any(|(k, _, _)| *k == key) {
                        return Err(LoadError {
                            line: node.line,
                            field: key,
                            reason: "duplicate key".into(),
                        });
                    }
                    *pending = Some((key, node.line));
                    Ok(())
                }
            },
        }
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

    /// A mapping of string to string whose keys must be in `allowed_keys`.
    pub fn opt_str_map(
        &mut self,
        key: &str,
        allowed_keys: &[&str],
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
    fn duplicate_keys_aliases_and_two_documents_are_refused() {
        let e = parse("a: 1\nb: 2\na: 3\n").expect_err("duplicate");
        assert_eq!((e.line, e.field.as_str()), (3, "a"));
        assert!(e.reason.contains("duplicate"));
        let e = parse("a: &x 1\nb: *x\n").expect_err("anchor");
        assert_eq!(e.line, 1);
        let e = parse("a: 1\n---\nb: 2\n").expect_err("two docs");
        assert!(e.reason.contains("more than one"), "{e}");
        let e = parse("a: [1, 2\n").expect_err("bad yaml");
        assert!(e.reason.contains("not valid YAML"), "{e}");
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
