//! Xid events from the kernel log. The NVIDIA driver logs GPU errors as
//! `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`
//! This parser accepts the line inside `dmesg` output (`[  123.456] NVRM: ...`),
//! `/dev/kmsg` records (`4,1234,5678901,-;NVRM: ...`) and `journalctl -k` lines
//! (`Mar 03 12:00:00 host kernel: NVRM: ...`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XidEvent {
    /// The PCI address as the driver wrote it, e.g. `0000:3b:00`.
    pub pci: String,
    pub xid: u32,
    pub pid: Option<u32>,
    /// The text after the Xid number (pid, process name, description).
    pub detail: String,
    /// Seconds since boot, when the line carries it (dmesg, kmsg).
    pub uptime_s: Option<f64>,
    /// The log line as read (cut at `LINE_CHARS_MAX`): the evidence an RMA asks for.
    #[serde(default)]
    pub line: String,
}

/// Longest log line kept with an event.
pub const LINE_CHARS_MAX: usize = 512;

/// Most events of one kind a probe reports: a GPU logging Xids in a loop would otherwise fill
/// the report. The count beyond is lost; the first `EVENTS_MAX` are kept.
pub const EVENTS_MAX: usize = 1000;

fn cut_line(line: &str) -> String {
    line.trim().chars().take(LINE_CHARS_MAX).collect()
}

/// One NVSwitch error from the kernel log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SxidEvent {
    /// The NVSwitch's PCI address as the driver wrote it, e.g. `0000:05:00.0`.
    pub pci: String,
    pub sxid: u32,
    /// `Fatal` or `Non-fatal` said the driver.
    pub fatal: bool,
    pub detail: String,
    pub uptime_s: Option<f64>,
    pub line: String,
}

impl XidEvent {
    /// Whether this event is on the GPU at `pci_bus_id` (NVML's `00000000:3B:00.0` form).
    pub fn matches_gpu(&self, pci_bus_id: &str) -> bool {
        normalize_pci(&self.pci) == normalize_pci(pci_bus_id)
    }
}

/// `00000000:3B:00.0` and `0000:3b:00` both become `0000:3b:00`: domain (4 hex digits),
/// bus and device, lower case, function dropped.
pub fn normalize_pci(addr: &str) -> String {
    let addr = addr.trim().to_ascii_lowercase();
    let mut parts: Vec<&str> = addr.split(':').collect();
    if parts.len() == 2 {
        parts.insert(0, "0000");
    }
    if parts.len() < 3 {
        return addr;
    }
    let domain = parts[0];
    let domain = if domain.len() > 4 {
        &domain[domain.len() - 4..]
    } else {
        domain
    };
    let device = parts[2].split('.').next().unwrap_or(parts[2]);
    format!("{domain:0>4}:{}:{device}", parts[1])
}

/// Every Xid event in `log`, in order. Lines that are not Xid reports are skipped.
pub fn parse_kernel_log(log: &str) -> Vec<XidEvent> {
    log.lines()
        .filter_map(parse_line)
        .take(EVENTS_MAX)
        .collect()
}

/// Every SXid event in `log`, in order (at most `EVENTS_MAX`).
pub fn parse_sxid_log(log: &str) -> Vec<SxidEvent> {
    log.lines()
        .filter_map(parse_sxid_line)
        .take(EVENTS_MAX)
        .collect()
}

/// One SXid event from one log line, if the line is one.
pub fn parse_sxid_line(line: &str) -> Option<SxidEvent> {
    const MARK: &str = "SXid (";
    let at = line.find(MARK)?;
    let prefix = &line[..at];
    if !prefix.contains("nvswitch") {
        return None;
    }
    let rest = &line[at + MARK.len()..];
    let close = rest.find(')')?;
    let pci = rest[..close].trim();
    let pci = pci.strip_prefix("PCI:").unwrap_or(pci).to_string();
    let rest = rest[close + 1..]
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let sxid: u32 = digits.parse().ok()?;
    let detail = rest[digits.len()..]
        .trim_start_matches(',')
        .trim()
        .to_string();
    let severity = detail.split(',').next().unwrap_or("").trim();
    Some(SxidEvent {
        pci,
        sxid,
        fatal: severity.eq_ignore_ascii_case("fatal"),
        detail,
        uptime_s: uptime(prefix.split("nvidia-nvswitch").next().unwrap_or("")),
        line: cut_line(line),
    })
}

/// One Xid event from one log line, if the line is one.
pub fn parse_line(line: &str) -> Option<XidEvent> {
    const MARK: &str = "NVRM: Xid (";
    let at = line.find(MARK)?;
    let prefix = &line[..at];
    let rest = &line[at + MARK.len()..];
    let close = rest.find(')')?;
    let pci = rest[..close].trim();
    let pci = pci.strip_prefix("PCI:").unwrap_or(pci).to_string();
    let rest = rest[close + 1..].trim_start();
    let rest = rest.strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let xid: u32 = digits.parse().ok()?;
    let detail = rest[digits.len()..]
        .trim_start_matches(',')
        .trim()
        .to_string();
    let pid = detail.split(',').find_map(|part| {
        let v = part.trim().strip_prefix("pid=")?;
        v.trim_matches('\'').parse().ok()
    });
    Some(XidEvent {
        pci,
        xid,
        pid,
        detail,
        uptime_s: uptime(prefix),
        line: cut_line(line),
    })
}

/// Seconds since boot from a dmesg prefix `[  123.456789] ` or a kmsg prefix
/// `4,1234,123456789,-;` (microseconds).
fn uptime(prefix: &str) -> Option<f64> {
    let p = prefix.trim();
    if let Some(inner) = p.strip_prefix('[') {
        let end = inner.find(']')?;
        return inner[..end].trim().parse().ok();
    }
    if let Some(head) = p.strip_suffix(';') {
        let fields: Vec<&str> = head.split(',').collect();
        if fields.len() >= 3 {
            let us: u64 = fields[2].parse().ok()?;
            return Some(us as f64 / 1_000_000.0);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dmesg_kmsg_and_journal_lines() {
        let dmesg = "[  123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.";
        let e = parse_line(dmesg).expect("xid");
        assert_eq!(e.pci, "0000:3b:00");
        assert_eq!(e.xid, 79);
        assert_eq!(e.pid, Some(1234));
        assert!(e.detail.ends_with("GPU has fallen off the bus."));
        assert_eq!(e.uptime_s, Some(123.456789));

        let kmsg = "4,1234,5678901,-;NVRM: Xid (PCI:0000:b8:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.";
        let e = parse_line(kmsg).expect("xid");
        assert_eq!((e.pci.as_str(), e.xid, e.pid), ("0000:b8:00", 48, None));
        assert_eq!(e.uptime_s, Some(5.678901));

        let journal = "Mar 03 12:00:00 gpu-a-01 kernel: NVRM: Xid (PCI:0000:18:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address";
        let e = parse_line(journal).expect("xid");
        assert_eq!((e.xid, e.uptime_s), (13, None));
    }

    #[test]
    fn skips_other_lines_and_malformed_xids() {
        let log = "[ 1.0] usb 1-1: new device\n[ 2.0] NVRM: Xid (PCI:0000:3b:00): abc, junk\nNVRM: loading NVIDIA UNIX driver\n[ 3.0] NVRM: Xid (PCI:0000:3b:00): 94, pid=7, Contained ECC error.\n";
        let events = parse_kernel_log(log);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].xid, 94);
    }

    #[test]
    fn sxid_lines_parse_with_their_severity() {
        let fatal = "[ 1234.5] nvidia-nvswitch2: SXid (PCI:0000:a6:00.0): 24007, Fatal, Link 44 sourcetrack TCEN0 crumbstore ECC DBE Error";
        let e = parse_sxid_line(fatal).expect("sxid");
        assert_eq!(
            (e.pci.as_str(), e.sxid, e.fatal),
            ("0000:a6:00.0", 24007, true)
        );
        assert_eq!(e.uptime_s, Some(1234.5));
        let non = "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)";
        let e = parse_sxid_line(non).expect("sxid");
        assert!(!e.fatal);
        assert!(e.detail.starts_with("Non-fatal, Link 32"));
        assert!(parse_sxid_line("[ 1.0] something SXid (PCI:x): 1, Fatal").is_none());
        assert_eq!(parse_sxid_log(&format!("{fatal}\nnoise\n{non}\n")).len(), 2);
    }

    #[test]
    fn pci_addresses_normalize_across_forms() {
        assert_eq!(normalize_pci("00000000:3B:00.0"), "0000:3b:00");
        assert_eq!(normalize_pci("0000:3b:00"), "0000:3b:00");
        assert!(parse_line("NVRM: Xid (PCI:0000:3b:00): 79, x")
            .expect("xid")
            .matches_gpu("00000000:3B:00.0"));
    }
}
