//! Manifest parsing and validation: worked examples in each format, then property tests
//! (valid manifests round-trip through every writer; a single corrupted field is reported
//! with its line and field name, and nothing else is).

use std::collections::BTreeMap;

use kiln_manifest::{parse, parse_bytes, write, FieldError, Format, NodeSpec};
use proptest::prelude::*;

fn errors(input: &str, format: Format) -> Vec<FieldError> {
    match parse(input, format, None) {
        Ok(m) => panic!("accepted a bad manifest: {m:?}"),
        Err(e) => e.errors,
    }
}

fn has(errs: &[FieldError], line: u64, field: &str, reason_part: &str) -> bool {
    errs.iter()
        .any(|e| e.line == Some(line) && e.field == field && e.reason.contains(reason_part))
}

const CSV_GOOD: &str = "\
hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,firmware_bios,firmware_gpu_vbios,firmware_nic,labels
# a comment line
gpu-a-01,a,10.0.0.11,H100-SXM,8,1.10,2.3.1,96.00.74.00.01,28.39.1002,row=3;pod=p1
GPU-A-02 , a ,https://bmc-a-02:8443,H100-SXM,8,1.10,2.3.1,96.00.74.00.01,28.39.1002,
cpu-a-03,a,[fe80::3]:443,,0,1.10,2.3.1,none,28.39.1002,
";

#[test]
fn csv_good_manifest_parses_in_order_with_normalisation() {
    let m = parse(CSV_GOOD, Format::Csv, Some("a")).expect("valid manifest");
    let names: Vec<_> = m.nodes.iter().map(|n| n.hostname.as_str()).collect();
    assert_eq!(names, ["gpu-a-01", "gpu-a-02", "cpu-a-03"]);
    assert_eq!(m.nodes[0].firmware_bmc, "1.10");
    assert_eq!(m.nodes[0].labels.get("pod").map(String::as_str), Some("p1"));
    assert_eq!(m.nodes[1].rack, "a", "cells are trimmed");
    assert_eq!(m.nodes[2].gpu_count, 0);
    assert_eq!(m.nodes[2].gpu_model, "");
}

#[test]
fn csv_bad_manifest_reports_every_error_with_line_and_field() {
    let input = "\
hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,firmware_bios,firmware_gpu_vbios,firmware_nic,labels
gpu-a-01,a,10.0.0.11,H100,8,1,2,3,4,
bad_host,a,10.0.0.12,H100,8,1,2,3,4,
gpu-a-03,a,http://10.0.0.13,H100,17,1,,3,4,row
gpu-a-01,b,10.0.0.14,,8,1,2,3,4,
";
    let errs = errors(input, Format::Csv);
    assert!(has(&errs, 3, "hostname", "RFC 1123"), "{errs:#?}");
    assert!(has(&errs, 4, "bmc_address", "\"http\""), "{errs:#?}");
    assert!(has(&errs, 4, "gpu_count", "0 to 16"), "{errs:#?}");
    assert!(has(&errs, 4, "firmware_bios", "missing"), "{errs:#?}");
    assert!(has(&errs, 4, "labels", "key=value"), "{errs:#?}");
    assert!(
        has(&errs, 5, "gpu_model", "required when gpu_count"),
        "{errs:#?}"
    );
    assert!(
        has(
            &errs,
            5,
            "hostname",
            "duplicate hostname \"gpu-a-01\": already listed at line 2"
        ),
        "{errs:#?}"
    );
    assert_eq!(errs.len(), 7, "{errs:#?}");
    assert!(errs.iter().all(|e| e.item.is_some()));
}

#[test]
fn csv_header_problems_are_reported_on_line_1() {
    let errs = errors("hostname,rack,colour\nx,a,red\n", Format::Csv);
    assert!(has(&errs, 1, "colour", "unknown column"), "{errs:#?}");
    assert!(
        has(&errs, 1, "bmc_address", "required column missing"),
        "{errs:#?}"
    );
    assert!(
        has(&errs, 1, "firmware_nic", "required column missing"),
        "{errs:#?}"
    );
}

#[test]
fn csv_row_with_too_many_cells() {
    let input = "hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,firmware_bios,firmware_gpu_vbios,firmware_nic\n\
                 n1,a,b1,m,1,1,2,3,4,extra\n";
    let errs = errors(input, Format::Csv);
    assert!(has(&errs, 2, "row", "10 cells"), "{errs:#?}");
}

#[test]
fn rack_must_match_the_rack_it_was_sent_for() {
    let errs = match parse(CSV_GOOD, Format::Csv, Some("b")) {
        Ok(_) => panic!("rack mismatch accepted"),
        Err(e) => e.errors,
    };
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert!(
        has(
            &errs,
            3,
            "rack",
            "does not match the rack this manifest was sent for (\"b\")"
        ),
        "{errs:#?}"
    );
}

#[test]
fn empty_and_non_utf8_manifests_are_refused() {
    for f in Format::ALL {
        assert!(parse("", f, None).is_err(), "{f}");
    }
    let errs = errors("hostname,rack,bmc_address,gpu_count,firmware_bmc,firmware_bios,firmware_gpu_vbios,firmware_nic\n", Format::Csv);
    assert_eq!(errs[0].field, "manifest");
    assert!(errs[0].reason.contains("no nodes"));
    let e = parse_bytes(b"hostname\n\xff\xfe", Format::Csv, None).expect_err("not utf-8");
    assert_eq!(e.errors[0].line, Some(2));
    assert!(e.errors[0].reason.contains("UTF-8"));
}

const JSON_BAD: &str = r#"{"nodes": [
  {"hostname": "gpu-a-01", "rack": "a", "bmc_address": "10.0.0.11", "gpu_model": "H100",
   "gpu_count": 8, "firmware_bmc": "1.10", "firmware_bios": "2", "firmware_gpu_vbios": "3",
   "firmware_nic": "4", "labels": {"row": "3", "u": 12}},
  {
    "hostname": "gpu-a-02", "rack": "a", "bmc_address": "10.0.0.12", "gpu_model": "H100",
    "gpu_count": "8", "firmware_bmc": 1.1, "firmware_bios": "2", "firmware_gpu_vbios": "3",
    "firmware_nic": "4", "colour": "red", "rack": "a"
  },
  [1, 2]
]}"#;

#[test]
fn json_errors_carry_the_line_where_the_node_starts() {
    let errs = errors(JSON_BAD, Format::Json);
    assert!(
        has(
            &errs,
            5,
            "firmware_bmc",
            "must be a string, got the number 1.1"
        ),
        "{errs:#?}"
    );
    assert!(has(&errs, 5, "colour", "unknown field"), "{errs:#?}");
    assert!(has(&errs, 5, "rack", "appears twice"), "{errs:#?}");
    assert!(
        has(&errs, 10, "node", "must be an object, got a list"),
        "{errs:#?}"
    );
    assert_eq!(errs.len(), 4, "gpu_count \"8\" is accepted: {errs:#?}");
    assert_eq!(
        errs.iter()
            .find(|e| e.line == Some(10))
            .and_then(|e| e.item),
        Some(3)
    );
}

#[test]
fn json_syntax_error_has_a_line() {
    let errs = errors("[\n{\"hostname\": \"a\",,}\n]", Format::Json);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].line, Some(2));
    assert!(errs[0].reason.contains("not valid JSON"));
}

const YAML_BAD: &str = "\
nodes:
  - hostname: gpu-a-01
    rack: a
    bmc_address: 10.0.0.11
    gpu_model: H100
    gpu_count: 8
    firmware_bmc: 1.10
    firmware_bios: 2.3
    firmware_gpu_vbios: 96.00.74
    firmware_nic: 28.39
    labels: {row: 3}
  - hostname: gpu-a-02
    rack: a
    bmc_address: ftp://10.0.0.12
    gpu_model: H100
    gpu_count: 20
    firmware_bmc: 1.10
    firmware_bios:
    firmware_gpu_vbios: 96.00.74
    firmware_nic: 28.39
    labels:
      bad key: 1
";

#[test]
fn yaml_keeps_scalars_as_written_and_reports_the_line_of_each_value() {
    let errs = errors(YAML_BAD, Format::Yaml);
    assert!(has(&errs, 14, "bmc_address", "\"ftp\""), "{errs:#?}");
    assert!(has(&errs, 16, "gpu_count", "0 to 16"), "{errs:#?}");
    assert!(has(&errs, 18, "firmware_bios", "missing"), "{errs:#?}");
    assert!(
        has(&errs, 22, "labels", "label key \"bad key\""),
        "{errs:#?}"
    );
    assert_eq!(errs.len(), 4, "{errs:#?}");

    let good: String = YAML_BAD
        .lines()
        .take(11)
        .map(|l| format!("{l}\n"))
        .collect();
    let m = parse(&good, Format::Yaml, None).expect("first node alone is valid");
    assert_eq!(m.nodes[0].firmware_bmc, "1.10", "not the float 1.1");
    assert_eq!(m.nodes[0].firmware_nic, "28.39");
    assert_eq!(m.nodes[0].labels.get("row").map(String::as_str), Some("3"));
}

#[test]
fn yaml_syntax_errors_and_shapes() {
    let errs = errors("nodes:\n  - hostname: a\n   bad: [\n", Format::Yaml);
    assert_eq!(errs.len(), 1);
    assert!(errs[0].reason.contains("not valid YAML"), "{errs:#?}");
    assert!(errors("a: 1\n", Format::Yaml)[0]
        .reason
        .contains("top-level key"));
    assert!(errors("- 1\n---\n- 2\n", Format::Yaml)[0]
        .reason
        .contains("more than one"));
    assert!(errors("- a\n", Format::Yaml)[0]
        .reason
        .contains("must be a mapping"));
    let dup = "- hostname: a\n  hostname: b\n";
    assert!(errors(dup, Format::Yaml)[0]
        .reason
        .contains("duplicated key"));
}

#[test]
fn format_from_path_and_content_type() {
    use std::path::Path;
    assert_eq!(
        Format::from_path(Path::new("x/rack.CSV")),
        Some(Format::Csv)
    );
    assert_eq!(Format::from_path(Path::new("rack.yml")), Some(Format::Yaml));
    assert_eq!(Format::from_path(Path::new("rack.txt")), None);
    assert_eq!(
        Format::from_content_type("application/json; charset=utf-8"),
        Some(Format::Json)
    );
    assert_eq!(Format::from_content_type("text/csv"), Some(Format::Csv));
    assert_eq!(
        Format::from_content_type("application/x-yaml"),
        Some(Format::Yaml)
    );
    assert_eq!(Format::from_content_type("text/plain"), None);
}

// ---------------------------------------------------------------------------------------------
// Properties

fn host_label() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?"
}

fn node(i: usize) -> impl Strategy<Value = NodeSpec> {
    let text = "[A-Za-z0-9][A-Za-z0-9 ._:+-]{0,20}[A-Za-z0-9]";
    (
        host_label(),
        "[a-z0-9][a-z0-9._-]{0,8}",
        prop_oneof![
            "10\\.(0|[1-9][0-9]?)\\.(0|[1-9][0-9]?)\\.(0|[1-9][0-9]?)(:[1-9][0-9]{0,3})?",
            "bmc-[a-z0-9]{1,8}(:443)?",
            "https://bmc-[a-z0-9]{1,8}(:8443)?/redfish/v1",
            "\\[fe80::[1-9a-f]{1,4}\\]:443",
        ],
        (0u8..=16),
        text,
        (text, text, text, text),
        proptest::collection::btree_map(
            "[a-z][a-z0-9._/-]{0,10}",
            "[A-Za-z0-9 =._-]{0,12}[A-Za-z0-9]",
            0..4,
        ),
    )
        .prop_map(
            move |(label, rack, bmc, count, model, (f1, f2, f3, f4), labels)| NodeSpec {
                hostname: format!("{label}.n{i}"),
                rack,
                bmc_address: bmc,
                gpu_model: if count == 0 && i.is_multiple_of(2) {
                    String::new()
                } else {
                    model
                },
                gpu_count: count,
                firmware_bmc: f1,
                firmware_bios: f2,
                firmware_gpu_vbios: f3,
                firmware_nic: f4,
                labels: labels
                    .into_iter()
                    .map(|(k, v): (String, String)| (k, v.trim().to_string()))
                    .collect::<BTreeMap<_, _>>(),
            },
        )
}

fn manifest() -> impl Strategy<Value = Vec<NodeSpec>> {
    (1usize..8).prop_flat_map(|n| (0..n).map(node).collect::<Vec<_>>())
}

fn format() -> impl Strategy<Value = Format> {
    prop_oneof![Just(Format::Csv), Just(Format::Json), Just(Format::Yaml)]
}

/// A corruption of one field of one node and the text it leaves in the output.
#[derive(Debug, Clone)]
enum Corruption {
    Set(&'static str, &'static str),
}

fn corruption() -> impl Strategy<Value = Corruption> {
    prop_oneof![
        Just(Corruption::Set("hostname", "bad_host")),
        Just(Corruption::Set("hostname", "-lead")),
        Just(Corruption::Set("rack", "rack 7")),
        Just(Corruption::Set("bmc_address", "ftp://bmc")),
        Just(Corruption::Set("bmc_address", "10.0.0.1:99999")),
        Just(Corruption::Set("gpu_count", "17")),
        Just(Corruption::Set("gpu_model", "")),
        Just(Corruption::Set("firmware_bmc", "")),
        Just(Corruption::Set("firmware_bios", "")),
        Just(Corruption::Set("firmware_gpu_vbios", "")),
        Just(Corruption::Set("firmware_nic", "")),
    ]
}

fn apply(n: &mut NodeSpec, c: &Corruption) {
    let Corruption::Set(field, value) = c;
    let v = value.to_string();
    match *field {
        "hostname" => n.hostname = v,
        "rack" => n.rack = v,
        "bmc_address" => n.bmc_address = v,
        "gpu_model" => {
            n.gpu_model = v;
            n.gpu_count = n.gpu_count.max(1);
        }
        "gpu_count" => n.gpu_count = v.parse().unwrap_or(u8::MAX),
        "firmware_bmc" => n.firmware_bmc = v,
        "firmware_bios" => n.firmware_bios = v,
        "firmware_gpu_vbios" => n.firmware_gpu_vbios = v,
        "firmware_nic" => n.firmware_nic = v,
        _ => {}
    }
}

/// The line a parser must report for `field` of node `index` in text written by `write`.
fn expected_line(text: &str, format: Format, index: usize, field: &str) -> u64 {
    let lines: Vec<&str> = text.lines().collect();
    let starts: Vec<usize> = match format {
        Format::Csv => return index as u64 + 2,
        Format::Json => (0..lines.len()).filter(|&i| lines[i] == "  {").collect(),
        Format::Yaml => (0..lines.len())
            .filter(|&i| lines[i].starts_with("  - "))
            .collect(),
    };
    let start = starts[index];
    match format {
        Format::Json => start as u64 + 1,
        _ => {
            let end = starts.get(index + 1).copied().unwrap_or(lines.len());
            let key = if field == "hostname" {
                "  - hostname:".to_string()
            } else {
                format!("    {field}:")
            };
            let at = (start..end)
                .find(|&i| lines[i].starts_with(&key))
                .expect("field line");
            at as u64 + 1
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn valid_manifests_round_trip(nodes in manifest(), format in format()) {
        let text = write(&nodes, format);
        let parsed = parse(&text, format, None);
        prop_assert!(parsed.is_ok(), "{:?}\n{}", parsed.err(), text);
        prop_assert_eq!(parsed.map(|m| m.nodes).unwrap_or_default(), nodes);
    }

    #[test]
    fn a_corrupted_field_is_reported_with_its_line_and_field(
        nodes in manifest(), format in format(), pick in any::<prop::sample::Index>(), c in corruption(),
    ) {
        let mut nodes = nodes;
        let index = pick.index(nodes.len());
        apply(&mut nodes[index], &c);
        let Corruption::Set(field, _) = c;
        let text = write(&nodes, format);
        let errs = match parse(&text, format, None) {
            Ok(_) => { prop_assert!(false, "accepted:\n{}", text); unreachable!() }
            Err(e) => e.errors,
        };
        prop_assert_eq!(errs.len(), 1, "{:#?}\n{}", errs, text);
        prop_assert_eq!(&errs[0].field, field);
        prop_assert_eq!(errs[0].item, Some(index + 1));
        prop_assert_eq!(errs[0].line, Some(expected_line(&text, format, index, field)), "{:#?}\n{}", errs, text);
    }
}
