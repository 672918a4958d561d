//! YAML: a list of node mappings, or a mapping `nodes:` holding that list. Scalars are kept as
//! written (the loader's early parsing is off), so `firmware_bios: 1.10` is the string "1.10"
//! and not the number 1.1. Every value carries its line. One document only; aliases are
//! expanded by the loader under its node budget (no billion-laughs blow-up).

use saphyr::{MarkedYaml, ScalarStyle, YamlData, YamlLoader};
use saphyr_parser::Parser;

use crate::raw::{RawField, RawItem, RawValue};
use crate::{ManifestErrors, MAX_NODES};

/// Alias expansion budget: far below the loader's default, far above any real manifest's use.
const ALIAS_NODES_MAX: usize = 10_000;

pub(crate) fn read(input: &str) -> Result<Vec<RawItem>, ManifestErrors> {
    let mut loader: YamlLoader<'_, MarkedYaml<'_>> = YamlLoader::default();
    loader.early_parse(false);
    loader.alias_limit(ALIAS_NODES_MAX);
    let mut parser = Parser::new_from_str(input);
    if let Err(e) = parser.load(&mut loader, true) {
        return Err(scan_error(&e));
    }
    if let Some(e) = loader.error() {
        return Err(scan_error(e));
    }
    let mut docs = loader.into_documents();
    if docs.len() > 1 {
        let line = docs[1].span.start.line() as u64;
        return Err(ManifestErrors::document(
            Some(line),
            "more than one YAML document: put every node in one list",
        ));
    }
    let Some(doc) = docs.pop() else {
        return Err(ManifestErrors::document(Some(1), "empty manifest"));
    };
    let doc_line = doc.span.start.line() as u64;
    let list = match untag(doc).data {
        YamlData::Sequence(list) => list,
        YamlData::Mapping(map) => {
            let mut nodes = None;
            for (k, v) in map {
                match scalar(&k).as_deref() {
                    Some("nodes") => nodes = Some(v),
                    other => {
                        return Err(ManifestErrors::document(
                            Some(k.span.start.line() as u64),
                            format!(
                                "unexpected top-level key {:?}: expected only `nodes`",
                                other.unwrap_or("(not a string)")
                            ),
                        ))
                    }
                }
            }
            match nodes.map(untag) {
                Some(MarkedYaml {
                    data: YamlData::Sequence(list),
                    ..
                }) => list,
                Some(other) => {
                    return Err(ManifestErrors::document(
                        Some(other.span.start.line() as u64),
                        "`nodes` must be a list of nodes",
                    ))
                }
                None => {
                    return Err(ManifestErrors::document(
                        Some(doc_line),
                        "missing `nodes` list",
                    ))
                }
            }
        }
        YamlData::Representation(text, ScalarStyle::Plain, _) if is_null(&text) => {
            return Err(ManifestErrors::document(Some(doc_line), "empty manifest"))
        }
        _ => {
            return Err(ManifestErrors::document(
                Some(doc_line),
                "expected a YAML list of nodes or a mapping with a `nodes` list",
            ))
        }
    };
    if list.len() > MAX_NODES {
        return Err(ManifestErrors::document(
            None,
            format!(
                "too many nodes: {} (at most {MAX_NODES} in one manifest)",
                list.len()
            ),
        ));
    }

    let mut items = Vec::with_capacity(list.len());
    for (i, node) in list.into_iter().enumerate() {
        let line = node.span.start.line() as u64;
        let mut item = RawItem {
            line: Some(line),
            item: i + 1,
            fields: Vec::new(),
            errors: Vec::new(),
        };
        match untag(node).data {
            YamlData::Mapping(map) => {
                for (k, v) in map {
                    let key_line = k.span.start.line() as u64;
                    match scalar(&k) {
                        Some(name) => {
                            let value_line = v.span.start.line() as u64;
                            let value = convert(v);
                            // A missing value's span is where the next token starts: use the key's.
                            let line = if value == RawValue::Missing {
                                key_line
                            } else {
                                value_line
                            };
                            item.fields.push(RawField {
                                name,
                                value,
                                line: Some(line),
                            });
                        }
                        None => item
                            .errors
                            .push(("node".into(), "a key must be a string".into())),
                    }
                }
            }
            other => item.errors.push((
                "node".into(),
                format!("each node must be a mapping, got {}", kind(&other)),
            )),
        }
        items.push(item);
    }
    Ok(items)
}

fn scan_error(e: &saphyr::ScanError) -> ManifestErrors {
    ManifestErrors::document(
        Some(e.marker().line() as u64),
        format!("not valid YAML: {}", e.info()),
    )
}

fn untag(node: MarkedYaml<'_>) -> MarkedYaml<'_> {
    let mut node = node;
    while let YamlData::Tagged(_, inner) = node.data {
        node = *inner;
    }
    node
}

/// A scalar node's text as written; `None` for collections.
fn scalar(node: &MarkedYaml<'_>) -> Option<String> {
    match &node.data {
        YamlData::Representation(text, _, _) => Some(text.to_string()),
        YamlData::Value(s) => Some(scalar_to_text(s)),
        YamlData::Tagged(_, inner) => scalar(inner),
        _ => None,
    }
}

fn scalar_to_text(s: &saphyr::Scalar<'_>) -> String {
    match s {
        saphyr::Scalar::Null => String::new(),
        saphyr::Scalar::Boolean(b) => b.to_string(),
        saphyr::Scalar::Integer(i) => i.to_string(),
        saphyr::Scalar::FloatingPoint(f) => f.to_string(),
        saphyr::Scalar::String(s) => s.to_string(),
    }
}

fn is_null(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

fn convert(node: MarkedYaml<'_>) -> RawValue {
    let node = untag(node);
    match node.data {
        YamlData::Representation(text, style, _) => {
            if style == ScalarStyle::Plain && is_null(&text) {
                RawValue::Missing
            } else {
                RawValue::Text(text.to_string())
            }
        }
        YamlData::Value(saphyr::Scalar::Null) => RawValue::Missing,
        YamlData::Value(s) => RawValue::Text(scalar_to_text(&s)),
        YamlData::Mapping(map) => RawValue::Map(
            map.into_iter()
                .map(|(k, v)| {
                    let line = v.span.start.line() as u64;
                    (scalar(&k).unwrap_or_default(), convert(v), Some(line))
                })
                .collect(),
        ),
        YamlData::Sequence(_) => RawValue::Other("a list"),
        _ => RawValue::Other("an unsupported YAML value"),
    }
}

fn kind<'a>(data: &YamlData<'a, MarkedYaml<'a>>) -> &'static str {
    match data {
        YamlData::Sequence(_) => "a list",
        YamlData::Mapping(_) => "a mapping",
        YamlData::Representation(..) | YamlData::Value(_) => "a scalar",
        _ => "an unsupported YAML value",
    }
}
