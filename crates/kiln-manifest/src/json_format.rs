//! JSON: `[{...}, ...]` or `{"nodes": [{...}, ...]}`. Each node is an object of the flat
//! fields; `labels` is an object of strings or a `"k=v;k2=v2"` string. serde_json gives no
//! position for a parsed value, so each node is kept as a borrowed `RawValue` slice of the
//! input: its offset gives the line where the node starts.

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue as JsonRaw;
use serde_json::Value;

use crate::raw::{RawField, RawItem, RawValue};
use crate::{line_at, ManifestErrors, MAX_NODES};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapped<'a> {
    #[serde(borrow)]
    nodes: Vec<&'a JsonRaw>,
}

pub(crate) fn read(input: &str) -> Result<Vec<RawItem>, ManifestErrors> {
    let trimmed = input.trim_start();
    let nodes: Vec<&JsonRaw> = match trimmed.as_bytes().first() {
        None => return Err(ManifestErrors::document(Some(1), "empty manifest")),
        Some(b'[') => serde_json::from_str(input).map_err(json_error)?,
        Some(b'{') => {
            serde_json::from_str::<Wrapped>(input)
                .map_err(json_error)?
                .nodes
        }
        Some(_) => {
            return Err(ManifestErrors::document(
                Some(line_at(input, (0, 1), input.len() - trimmed.len())),
                "expected a JSON list of nodes or an object {\"nodes\": [...]}",
            ))
        }
    };
    if nodes.len() > MAX_NODES {
        return Err(ManifestErrors::document(
            None,
            format!(
                "too many nodes: {} (at most {MAX_NODES} in one manifest)",
                nodes.len()
            ),
        ));
    }

    let base = input.as_ptr() as usize;
    let mut cursor = (0usize, 1u64);
    let mut items = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        // The RawValue borrows from `input`, so its address lies inside it.
        let offset = (node.get().as_ptr() as usize).saturating_sub(base);
        let line = line_at(input, cursor, offset);
        cursor = (offset, line);
        let mut item = RawItem {
            line: Some(line),
            item: i + 1,
            fields: Vec::new(),
            errors: Vec::new(),
        };
        match serde_json::from_str::<Entries>(node.get()) {
            Ok(Entries(entries)) => {
                for (name, value) in entries {
                    item.fields.push(RawField {
                        name,
                        value: convert(value),
                        line: None,
                    });
                }
            }
            Err(_) => item.errors.push((
                "node".into(),
                format!("each node must be an object, got {}", json_kind(node.get())),
            )),
        }
        items.push(item);
    }
    Ok(items)
}

fn json_kind(text: &str) -> &'static str {
    match text.trim_start().as_bytes().first() {
        Some(b'[') => "a list",
        Some(b'"') => "a string",
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        _ => "a number",
    }
}

fn convert(value: Value) -> RawValue {
    match value {
        Value::Null => RawValue::Missing,
        Value::Bool(b) => RawValue::Bool(b),
        Value::Number(n) => RawValue::Number(n.to_string()),
        Value::String(s) => RawValue::Text(s),
        Value::Array(_) => RawValue::Other("a list"),
        Value::Object(map) => RawValue::Map(
            map.into_iter()
                .map(|(k, v)| (k, convert(v), None))
                .collect(),
        ),
    }
}

fn json_error(e: serde_json::Error) -> ManifestErrors {
    let line = if e.line() > 0 {
        Some(e.line() as u64)
    } else {
        None
    };
    ManifestErrors::document(line, format!("not valid JSON: {e}"))
}

/// An object's entries in input order, duplicates kept (serde_json's Map would keep only the
/// last of a repeated key, silently).
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}
