//! NVIDIA's tables, kept in the repository and versioned: the Xid catalog (what each Xid
//! means and its immediate action) and DCGM's failure codes (`DCGM_FR_*` with severity and
//! category). Each table names its source and version in its header; Kiln's action for each
//! row is the last-but-one column.

use std::sync::OnceLock;

use crate::finding::Action;

/// One row of the Xid table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidClass {
    pub xid: u32,
    pub mnemonic: String,
    pub description: String,
    /// NVIDIA's immediate action (`RESET_GPU`, `RESTART_BM`, ...).
    pub bucket: String,
    /// `application` or `hardware`.
    pub class: String,
    pub action: Action,
}

/// One row of the DCGM failure-code table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcgmCode {
    pub id: u32,
    pub name: String,
    /// DCGM's `DCGM_ERROR_*` severity without the prefix (`ISOLATE`, `RESET`, ...).
    pub severity: String,
    /// DCGM's `DCGM_FR_EC_*` category without the prefix (`HARDWARE_MEMORY`, ...).
    pub category: String,
    pub action: Action,
    pub description: String,
}

const XID_TABLE: &str = include_str!("../tables/xid-catalog.tsv");
const DCGM_TABLE: &str = include_str!("../tables/dcgm-errors.tsv");

/// A table's `# version:` line.
fn version(table: &str) -> &str {
    table
        .lines()
        .find_map(|l| l.strip_prefix("# version:"))
        .map(str::trim)
        .unwrap_or("unversioned")
}

/// The Xid table's version (`xid-catalog-r570`).
pub fn xid_table_version() -> &'static str {
    version(XID_TABLE)
}

/// The DCGM table's version (`dcgm-4.6.0`).
pub fn dcgm_table_version() -> &'static str {
    version(DCGM_TABLE)
}

/// Data rows of a TSV table: `columns` fields each, comments and blanks skipped. The tables are
/// compiled in, so a malformed row is a build defect: the unit tests load every row.
fn rows(table: &'static str, columns: usize) -> impl Iterator<Item = Vec<&'static str>> {
    table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(move |l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), columns, "table row {l:?}");
            f
        })
}

fn xid_rows() -> &'static [XidClass] {
    static TABLE: OnceLock<Vec<XidClass>> = OnceLock::new();
    TABLE.get_or_init(|| {
        rows(XID_TABLE, 6)
            .filter_map(|f| {
                Some(XidClass {
                    xid: f[0].parse().ok()?,
                    mnemonic: f[1].into(),
                    description: f[2].into(),
                    bucket: f[3].into(),
                    class: f[4].into(),
                    action: Action::parse(f[5])?,
                })
            })
            .collect()
    })
}

fn dcgm_rows() -> &'static [DcgmCode] {
    static TABLE: OnceLock<Vec<DcgmCode>> = OnceLock::new();
    TABLE.get_or_init(|| {
        rows(DCGM_TABLE, 6)
            .filter_map(|f| {
                Some(DcgmCode {
                    id: f[0].parse().ok()?,
                    name: f[1].into(),
                    severity: f[2].into(),
                    category: f[3].into(),
                    action: Action::parse(f[4])?,
                    description: f[5].into(),
                })
            })
            .collect()
    })
}

/// The Xid's catalog entry, if the table has it.
pub fn xid_class(xid: u32) -> Option<&'static XidClass> {
    xid_rows().iter().find(|r| r.xid == xid)
}

/// The DCGM failure code's entry, if the table has it.
pub fn dcgm_code(id: u32) -> Option<&'static DcgmCode> {
    dcgm_rows().iter().find(|r| r.id == id)
}

/// DCGM's severity enum value (`error_severity` in its JSON) as its name.
pub fn dcgm_severity_name(v: i64) -> &'static str {
    match v {
        0 => "NONE",
        1 => "MONITOR",
        2 => "ISOLATE",
        3 => "UNKNOWN",
        4 => "TRIAGE",
        5 => "CONFIG",
        6 => "RESET",
        _ => "?",
    }
}

/// DCGM's category enum value (`error_category` in its JSON) as its name.
pub fn dcgm_category_name(v: i64) -> &'static str {
    const NAMES: [&str; 17] = [
        "NONE",
        "PERF_THRESHOLD",
        "PERF_VIOLATION",
        "SOFTWARE_CONFIG",
        "SOFTWARE_LIBRARY",
        "SOFTWARE_XID",
        "SOFTWARE_CUDA",
        "SOFTWARE_EUD",
        "SOFTWARE_OTHER",
        "HARDWARE_THERMAL",
        "HARDWARE_MEMORY",
        "HARDWARE_NVLINK",
        "HARDWARE_NVSWITCH",
        "HARDWARE_PCIE",
        "HARDWARE_POWER",
        "HARDWARE_OTHER",
        "INTERNAL_OTHER",
    ];
    usize::try_from(v)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("?")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_tables_load_whole_and_name_their_source() {
        let xids = xid_rows();
        assert_eq!(
            xids.len(),
            rows(XID_TABLE, 6).count(),
            "every Xid row parses"
        );
        assert!(XID_TABLE.contains("# source: NVIDIA"));
        assert_eq!(xid_table_version(), "xid-catalog-r570");
        let dcgm = dcgm_rows();
        assert_eq!(
            dcgm.len(),
            rows(DCGM_TABLE, 6).count(),
            "every DCGM row parses"
        );
        assert_eq!(
            dcgm.len(),
            133,
            "DCGM 4.6.0 has 133 failure codes (0..=132)"
        );
        assert!(DCGM_TABLE.contains("# source: NVIDIA/DCGM 4.6.0"));
        for (i, r) in dcgm.iter().enumerate() {
            assert_eq!(r.id as usize, i, "ids dense and ordered");
        }
    }

    #[test]
    fn lookups_give_nvidia_classes_and_kiln_actions() {
        let x79 = xid_class(79).expect("79");
        assert_eq!(
            (x79.bucket.as_str(), x79.action),
            ("RESTART_BM", Action::Reboot)
        );
        assert_eq!(xid_class(109).map(|x| x.action), Some(Action::ResetGpu));
        assert_eq!(xid_class(13).map(|x| x.class.as_str()), Some("application"));
        assert!(xid_class(9999).is_none());
        let faulty = dcgm_code(52).expect("52");
        assert_eq!(faulty.name, "DCGM_FR_FAULTY_MEMORY");
        assert_eq!(
            (faulty.severity.as_str(), faulty.action),
            ("ISOLATE", Action::Rma)
        );
        assert_eq!(dcgm_code(80).map(|c| c.action), Some(Action::Rma));
        assert_eq!(dcgm_code(29).map(|c| c.action), Some(Action::Config));
        assert_eq!(dcgm_severity_name(2), "ISOLATE");
        assert_eq!(dcgm_category_name(10), "HARDWARE_MEMORY");
        assert_eq!(dcgm_category_name(99), "?");
    }
}
