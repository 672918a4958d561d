//! HTML building blocks: URL path segments, the page frame (inline CSS, a small inline
//! auto-refresh script; nothing loaded from elsewhere), state chips and progress bars, times.
//!
//! Pages are maud templates: every interpolated string (from a manifest, an agent or the
//! broker) is escaped by the template engine; inside URLs it goes through [`path_segment`] too.

use std::fmt::Write as _;

use kiln_store::dashboard::RackSummary;
use kiln_store::NodeState;
use maud::{html, Markup, PreEscaped, DOCTYPE};

/// Percent-encodes one URL path segment: everything but RFC 3986 unreserved characters.
pub fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

pub fn rack_href(rack: &str) -> String {
    format!("/racks/{}", path_segment(rack))
}

pub fn node_href(hostname: &str) -> String {
    format!("/nodes/{}", path_segment(hostname))
}

/// The CSS class (and colour) of a state.
pub fn state_class(state: NodeState) -> &'static str {
    match state {
        NodeState::Queued => "st-queued",
        NodeState::Running => "st-running",
        NodeState::Passed => "st-passed",
        NodeState::Retrying => "st-retrying",
        NodeState::DeadLettered => "st-dead",
    }
}

/// A state as a coloured chip.
pub fn chip(state: NodeState) -> Markup {
    html! { span class={ "chip " (state_class(state)) } { (state.as_str()) } }
}

/// Order in bars and tables: done first, then the work still to do.
pub const STATE_ORDER: [NodeState; 5] = [
    NodeState::Passed,
    NodeState::DeadLettered,
    NodeState::Running,
    NodeState::Retrying,
    NodeState::Queued,
];

const CSS: &str = "\
body{font-family:system-ui,sans-serif;margin:0;color:#1d2430;background:#f6f7f9}\
header{background:#1d2430;color:#fff;padding:.6rem 1.2rem;display:flex;gap:1.5rem;align-items:baseline}\
header a{color:#cfe3ff;text-decoration:none}header .brand{font-weight:700;color:#fff}\
main{padding:1rem 1.2rem;max-width:1200px}\
table{border-collapse:collapse;width:100%;background:#fff;margin:.5rem 0 1.2rem}\
th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #e3e6ea;vertical-align:top}\
th{background:#eef0f3;font-weight:600}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}\
.bar{display:flex;height:14px;min-width:200px;background:#e3e6ea;border-radius:3px;overflow:hidden}\
.bar span{display:block;height:100%}\
.st-passed{background:#2e9d4f}.st-dead{background:#c8322d}.st-running{background:#e6a317}\
.st-retrying{background:#a05cc8}.st-queued{background:#9aa3ad}\
.chip{display:inline-block;padding:0 .4rem;border-radius:3px;color:#fff;font-size:.85em}\
.v-pass{color:#2e7d3f;font-weight:600}.v-fail,.v-error{color:#c8322d;font-weight:600}\
.v-warn{color:#b07a00;font-weight:600}.v-skip{color:#667}\
pre{background:#f0f2f5;padding:.5rem;overflow:auto;max-height:24rem;white-space:pre-wrap;word-break:break-all}\
.muted{color:#667}.error{background:#fde8e7;border:1px solid #c8322d;padding:.5rem}\
.act{display:inline-block;padding:0 .4rem;border-radius:3px;color:#fff;background:#5a6b7d}\
.act-rma{background:#c8322d}.act-hands{background:#e6a317;color:#000}\
.legend span{margin-right:1rem}.legend i{display:inline-block;width:.8rem;height:.8rem;margin-right:.3rem}";

/// Reloads the page every `secs` seconds unless the operator unticked the box (kept in
/// localStorage, so the choice survives the reload).
const REFRESH_JS: &str = "\
(function(){var b=document.getElementById('auto');if(!b)return;\
var k='kiln-dashboard-auto';b.checked=localStorage.getItem(k)!=='off';\
b.onchange=function(){localStorage.setItem(k,b.checked?'on':'off')};\
setTimeout(function(){if(b.checked)location.reload()},Number(b.dataset.secs)*1000);})();";

/// A whole page. `refresh_secs` 0: the page does not reload itself (error pages). The CSS
/// and script are this module's constants, the only markup not built by a template.
pub fn page(title: &str, refresh_secs: u64, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width,initial-scale=1";
                title { (title) " · Kiln" }
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    a class="brand" href="/" { "Kiln burn-in" }
                    a href="/" { "Racks" }
                    a href="/dead-letters" { "Dead letters" }
                    a href="/lag" { "Consumer lag" }
                    @if refresh_secs > 0 {
                        label class="muted" style="margin-left:auto;color:#cfd5dd" {
                            input type="checkbox" id="auto" data-secs=(refresh_secs);
                            " auto-refresh " (refresh_secs) "s"
                        }
                    }
                }
                main { (body) }
                script { (PreEscaped(REFRESH_JS)) }
            }
        }
    }
    .into_string()
}

/// A stacked bar of a rack's states, widths in proportion to the counts.
pub fn state_bar(summary: &RackSummary) -> Markup {
    let total = summary.total();
    let label: Vec<String> = STATE_ORDER
        .iter()
        .map(|s| format!("{} {}", summary.count(*s), s.as_str()))
        .collect();
    html! {
        div class="bar" role="img" aria-label=(label.join(", ")) {
            @if total > 0 {
                @for state in STATE_ORDER {
                    @let n = summary.count(state);
                    @if n > 0 {
                        span class=(state_class(state))
                            style=(format!("width:{:.3}%", n as f64 * 100.0 / total as f64))
                            title=(format!("{n} {}", state.as_str())) {}
                    }
                }
            }
        }
    }
}

/// Percentage of `part` in `whole`, one decimal ("0.0" for an empty whole).
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0.0".into();
    }
    format!("{:.1}", part as f64 * 100.0 / whole as f64)
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Civil date of a day count from 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_pages() {
        let p = page("<script>alert('x')</script>", 5, html! { p { "&\"q\"" } });
        assert!(p.contains("<title>&lt;script&gt;alert('x')&lt;/script&gt; · Kiln</title>"));
        assert!(p.contains("<p>&amp;&quot;q&quot;</p>"), "{p}");
        assert!(p.contains("data-secs=\"5\""));
        assert!(!page("t", 0, html! {}).contains("id=\"auto\""));
        assert_eq!(path_segment("rack a/../b?x=1"), "rack%20a%2F..%2Fb%3Fx%3D1");
        assert_eq!(path_segment("gpu-a-01.dc"), "gpu-a-01.dc");
        assert_eq!(path_segment("é"), "%C3%A9");
    }

    #[test]
    fn bars_and_numbers() {
        let mut s = RackSummary::new("r");
        s.counts.insert(NodeState::Passed, 3);
        s.counts.insert(NodeState::Queued, 1);
        let bar = state_bar(&s).into_string();
        assert!(bar.contains("st-passed\" style=\"width:75.000%"), "{bar}");
        assert!(bar.contains("st-queued\" style=\"width:25.000%"), "{bar}");
        assert!(
            !bar.contains("st-dead\""),
            "empty states have no segment: {bar}"
        );
        assert_eq!(percent(1, 3), "33.3");
        assert_eq!(percent(0, 0), "0.0");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_714_564_800_250), "2024-05-01 12:00:00 UTC");
    }
}
