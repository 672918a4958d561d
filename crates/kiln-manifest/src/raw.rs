//! The format-independent form every reader produces and the validator checks.

/// A value as read, before validation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RawValue {
    /// Absent: an empty CSV cell, JSON `null`, YAML `~`/`null`/nothing.
    Missing,
    /// Text as written (CSV cell, JSON string, YAML scalar with its original spelling).
    Text(String),
    /// A JSON number, as its decimal text.
    Number(String),
    /// A JSON boolean.
    Bool(bool),
    /// A JSON object or YAML mapping (only `labels` may be one): key, value, line of the value.
    Map(Vec<(String, RawValue, Option<u64>)>),
    /// Anything else, by kind ("a list", "an object"), for the error message.
    Other(&'static str),
}

impl RawValue {
    /// Scalars as text (labels accept `pod: 3`); `None` for maps, lists and missing.
    pub(crate) fn scalar_text(&self) -> Option<String> {
        match self {
            RawValue::Text(s) | RawValue::Number(s) => Some(s.clone()),
            RawValue::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            RawValue::Missing => "nothing",
            RawValue::Text(_) => "a string",
            RawValue::Number(_) => "a number",
            RawValue::Bool(_) => "a boolean",
            RawValue::Map(_) => "a map",
            RawValue::Other(kind) => kind,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct RawField {
    pub(crate) name: String,
    pub(crate) value: RawValue,
    /// Line of the value where the format gives it (YAML), else `None` (the item's line is used).
    pub(crate) line: Option<u64>,
}

/// One node as read: its position and its fields in input order.
#[derive(Debug, Clone)]
pub(crate) struct RawItem {
    pub(crate) line: Option<u64>,
    /// 1-based.
    pub(crate) item: usize,
    pub(crate) fields: Vec<RawField>,
    /// Errors the reader already found for this item (e.g. a CSV row with too many cells).
    pub(crate) errors: Vec<(String, String)>,
}
