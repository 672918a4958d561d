//! The lag chart: one polyline per series (group, topic, partition) over the sampled window,
//! as inline SVG. x = time since the first point shown, y = lag in records from 0 to the
//! window's maximum.

use std::fmt::Write as _;

use crate::html::esc;
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
pub fn lag_chart(h: &LagHistory, now_ms: i64) -> String {
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

    let mut svg = format!(
        "<svg id=\"lag-chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {H}\" \
         width=\"100%\" style=\"max-width:{W}px;background:#fff\" role=\"img\" \
         aria-label=\"consumer lag per partition\">"
    );
    // Axes, the y scale (0 and max) and the window length.
    let _ = write!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{yb}\" stroke=\"#888\"/>\
         <line x1=\"{LEFT}\" y1=\"{yb}\" x2=\"{xr}\" y2=\"{yb}\" stroke=\"#888\"/>\
         <text x=\"{tx}\" y=\"{ty0}\" font-size=\"11\" text-anchor=\"end\">0</text>\
         <text x=\"{tx}\" y=\"{tymax}\" font-size=\"11\" text-anchor=\"end\">{max_lag}</text>\
         <text x=\"{LEFT}\" y=\"{tyb}\" font-size=\"11\">-{secs}s</text>\
         <text x=\"{xr}\" y=\"{tyb}\" font-size=\"11\" text-anchor=\"end\">now</text>",
        yb = H - BOTTOM,
        xr = W - RIGHT,
        tx = LEFT - 4.0,
        ty0 = H - BOTTOM,
        tymax = TOP + 10.0,
        tyb = H - 8.0,
        secs = (t1 - t0 + 500) / 1000,
    );
    if series.is_empty() {
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{}\" font-size=\"14\" text-anchor=\"middle\" fill=\"#667\">\
             no lag samples yet</text>",
            W / 2.0,
            H / 2.0
        );
    }
    for (i, (key, pts)) in series.iter().enumerate() {
        let points: Vec<String> = pts
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.at_ms), y(p.lag)))
            .collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\">\
             <title>{}</title></polyline>",
            colour(i),
            points.join(" "),
            esc(&key.label())
        );
    }
    svg.push_str("</svg>");
    let mut legend = String::from("<div class=\"legend\">");
    for (i, (key, _)) in series.iter().enumerate() {
        let _ = write!(
            legend,
            "<span><i style=\"background:{}\"></i>{}</span>",
            colour(i),
            esc(&key.label())
        );
    }
    if h.series.len() > MAX_LINES {
        let _ = write!(
            legend,
            "<span class=\"muted\">(+{} more series in the table)</span>",
            h.series.len() - MAX_LINES
        );
    }
    legend.push_str("</div>");
    svg + &legend
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
        let svg = lag_chart(&h, 6000);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("&lt;evil&gt; kiln.nodes/1") && !svg.contains("<evil>"));
        // burnin/0 goes from lag 5 (half way up) to lag 10 (the top) across the whole width.
        assert!(svg.contains("points=\"60.0,120.0 890.0,10.0\""), "{svg}");
        let empty = lag_chart(&LagHistory::new(0, 10, 10), 0);
        assert!(empty.contains("<svg") && empty.contains("no lag samples yet"));
    }
}
