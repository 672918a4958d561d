//! The lag chart: one polyline per series (group, topic, partition) over the sampled window,
//! as inline SVG. x = time since the first point shown, y = lag in records from 0 to the
//! window's maximum.

use maud::{html, Markup};

use crate::lag::LagHistory;

const W: f64 = 900.0;
const H: f64 = 260.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 10.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 30.0;
/// Series drawn at most; the table under the chart lists every series.
pub const MAX_LINES: usize = 24;

const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

pub fn colour(i: usize) -> &'static str {
    COLOURS[i % COLOURS.len()]
}

/// The chart (an `<svg>` element, always present; it says so when there is nothing yet) and
/// its legend.
pub fn lag_chart(h: &LagHistory, now_ms: i64) -> Markup {
    let series: Vec<_> = h.series.iter().take(MAX_LINES).collect();
    let t0 = series
        .iter()
        .filter_map(|(_, pts)| pts.front().map(|p| p.at_ms))
        .min()
        .unwrap_or(now_ms);
    let t1 = now_ms.max(t0 + 1000);
    let max_lag = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.lag))
        .max()
        .unwrap_or(0)
        .max(1);
    let x = |t: i64| LEFT + (t - t0) as f64 / (t1 - t0) as f64 * (W - LEFT - RIGHT);
    let y = |lag: i64| TOP + (1.0 - lag as f64 / max_lag as f64) * (H - TOP - BOTTOM);
    let lines: Vec<(usize, String, String)> = series
        .iter()
        .enumerate()
        .map(|(i, (key, pts))| {
            let points: Vec<String> = pts
                .iter()
                .map(|p| format!("{:.1},{:.1}", x(p.at_ms), y(p.lag)))
                .collect();
            (i, points.join(" "), key.label())
        })
        .collect();
    let (yb, xr) = (H - BOTTOM, W - RIGHT);
    html! {
        svg id="lag-chart" xmlns="http://www.w3.org/2000/svg" viewBox=(format!("0 0 {W} {H}"))
            width="100%" style=(format!("max-width:{W}px;background:#fff")) role="img"
            aria-label="consumer lag per partition" {
            // Axes, the y scale (0 and max) and the window length.
            line x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(yb) stroke="#888" {}
            line x1=(LEFT) y1=(yb) x2=(xr) y2=(yb) stroke="#888" {}
            text x=(LEFT - 4.0) y=(yb) font-size="11" text-anchor="end" { "0" }
            text x=(LEFT - 4.0) y=(TOP + 10.0) font-size="11" text-anchor="end" { (max_lag) }
            text x=(LEFT) y=(H - 8.0) font-size="11" { "-" ((t1 - t0 + 500) / 1000) "s" }
            text x=(xr) y=(H - 8.0) font-size="11" text-anchor="end" { "now" }
            @if series.is_empty() {
                text x=(W / 2.0) y=(H / 2.0) font-size="14" text-anchor="middle" fill="#667" {
                    "no lag samples yet"
                }
            }
            @for (i, points, label) in &lines {
                polyline fill="none" stroke=(colour(*i)) stroke-width="2" points=(points) {
                    title { (label) }
                }
            }
        }
        div class="legend" {
            @for (i, _, label) in &lines {
                span { i style=(format!("background:{}", colour(*i))) {} (label) }
            }
            @if h.series.len() > MAX_LINES {
                span class="muted" { "(+" (h.series.len() - MAX_LINES) " more series in the table)" }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lag::{LagReading, SeriesKey};

    #[test]
    fn chart_has_one_line_per_series_with_escaped_labels() {
        let mut h = LagHistory::new(0, 10, 10);
        let r = |group: &str, p: i32, lag: i64| LagReading {
            key: SeriesKey {
                group: group.into(),
                topic: "kiln.nodes".into(),
                partition: p,
            },
            committed: Some(1),
            log_end: lag + 1,
            lag,
        };
        h.record(1000, vec![r("burnin", 0, 5), r("<evil>", 1, 0)]);
        h.record(6000, vec![r("burnin", 0, 10), r("<evil>", 1, 2)]);
        let svg = lag_chart(&h, 6000).into_string();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("&lt;evil&gt; kiln.nodes/1") && !svg.contains("<evil>"));
        // burnin/0 goes from lag 5 (half way up) to lag 10 (the top) across the whole width.
        assert!(svg.contains("points=\"60.0,120.0 890.0,10.0\""), "{svg}");
        let empty = lag_chart(&LagHistory::new(0, 10, 10), 0).into_string();
        assert!(empty.contains("<svg") && empty.contains("no lag samples yet"));
    }
}
