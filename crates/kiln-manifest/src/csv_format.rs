//! CSV: a header row naming the columns (any order, from [`crate::FIELDS`]), one node per row.
//! Cells are trimmed; an empty cell is a missing value; lines starting with `#` are comments.

use crate::raw::{RawField, RawItem, RawValue};
use crate::{FieldError, ManifestErrors, FIELDS, MAX_NODES};

const REQUIRED: [&str; 8] = [
    "hostname",
    "rack",
    "bmc_address",
    "gpu_count",
    "firmware_bmc",
    "firmware_bios",
    "firmware_gpu_vbios",
    "firmware_nic",
];

pub(crate) fn read(input: &str) -> Result<Vec<RawItem>, ManifestErrors> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .flexible(true)
        .from_reader(input.as_bytes());

    let header = match reader.headers() {
        Ok(h) => h.clone(),
        Err(e) => return Err(csv_error(&e)),
    };
    let header_line = header.position().map_or(1, |p| p.line());
    if header.is_empty() || header.iter().all(str::is_empty) {
        return Err(ManifestErrors::document(
            Some(header_line),
            "empty manifest: expected a header row naming the columns",
        ));
    }

    // Header problems make every row unreadable: report them all, then stop.
    let mut header_errors = Vec::new();
    let columns: Vec<String> = header.iter().map(|c| c.to_ascii_lowercase()).collect();
    for (i, col) in columns.iter().enumerate() {
        if !FIELDS.contains(&col.as_str()) {
            header_errors.push(header_error(
                header_line,
                col,
                format!("unknown column (expected columns: {})", FIELDS.join(", ")),
            ));
        } else if columns[..i].contains(col) {
            header_errors.push(header_error(
                header_line,
                col,
                "column appears twice".into(),
            ));
        }
    }
    for req in REQUIRED {
        if !columns.iter().any(|c| c == req) {
            header_errors.push(header_error(
                header_line,
                req,
                "required column missing".into(),
            ));
        }
    }
    if !header_errors.is_empty() {
        return Err(ManifestErrors {
            errors: header_errors,
            omitted: 0,
        });
    }

    let mut items = Vec::new();
    let mut record = csv::StringRecord::new();
    loop {
        match reader.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(csv_error(&e)),
        }
        if record.iter().all(str::is_empty) {
            continue; // a row of only commas
        }
        if items.len() == MAX_NODES {
            return Err(ManifestErrors::document(
                record.position().map(|p| p.line()),
                format!("too many nodes: at most {MAX_NODES} in one manifest"),
            ));
        }
        let line = record.position().map(|p| record_line(input, p));
        let mut raw = RawItem {
            line,
            item: items.len() + 1,
            fields: Vec::new(),
            errors: Vec::new(),
        };
        if record.len() > columns.len() {
            raw.errors.push((
                "row".into(),
                format!(
                    "{} cells, but the header names {} columns",
                    record.len(),
                    columns.len()
                ),
            ));
        }
        for (i, col) in columns.iter().enumerate() {
            let value = match record.get(i) {
                None | Some("") => RawValue::Missing,
                Some(cell) => RawValue::Text(cell.to_string()),
            };
            raw.fields.push(RawField {
                name: col.clone(),
                value,
                line: None,
            });
        }
        items.push(raw);
    }
    Ok(items)
}

/// The line a record really starts on. csv reports the start of what it consumed for the
/// record, which includes comment and blank lines skipped before it.
fn record_line(input: &str, pos: &csv::Position) -> u64 {
    let mut offset = (pos.byte() as usize).min(input.len());
    let mut line = pos.line();
    loop {
        let rest = &input[offset..];
        let end = rest.find('\n');
        let this = &rest[..end.unwrap_or(rest.len())];
        let skipped = this.trim().is_empty() || this.starts_with('#');
        match end {
            Some(end) if skipped => {
                offset += end + 1;
                line += 1;
            }
            _ => return line,
        }
    }
}

fn header_error(line: u64, field: &str, reason: String) -> FieldError {
    FieldError {
        line: Some(line),
        item: None,
        field: field.to_string(),
        reason,
    }
}

fn csv_error(e: &csv::Error) -> ManifestErrors {
    let line = e.position().map(|p| p.line());
    ManifestErrors::document(line, format!("not valid CSV: {e}"))
}
