//! `kiln status`: every rack's nodes by state, with a progress bar per rack and totals.
//! At a terminal the bars are coloured and stacked by state; `--watch` redraws them in place
//! (through indicatif) until Ctrl-C. Piped, or with `--plain`, it prints aligned columns
//! without colour or bars, one line per rack and a TOTAL line, for scripts.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln_store::dashboard::{totals, RackSummary};
use kiln_store::{NodeState, Store};

use crate::platform_args::StoreArgs;

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Refresh every SECS seconds (default 2) until Ctrl-C.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2")]
    watch: Option<f64>,
    /// Plain columns without colour or bars (the default when stdout is not a terminal).
    #[arg(long)]
    plain: bool,
}

/// Bars and counts are shown in this order: finished first, then the work still to do.
const ORDER: [NodeState; 5] = [
    NodeState::Passed,
    NodeState::DeadLettered,
    NodeState::Running,
    NodeState::Retrying,
    NodeState::Queued,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Aligned columns, no escape codes.
    Plain,
    /// Stacked bars of `width` cells, coloured when `color`.
    Bars { width: usize, color: bool },
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let interval = match args.watch {
        None => None,
        Some(s) if s.is_finite() && (0.1..=86_400.0).contains(&s) => {
            Some(Duration::from_secs_f64(s))
        }
        Some(s) => bail!("--watch {s}: give a refresh interval of 0.1 to 86400 seconds"),
    };
    let tty = std::io::stdout().is_terminal();
    let style = if args.plain || !tty {
        Style::Plain
    } else {
        Style::Bars {
            width: 30,
            color: true,
        }
    };
    let store = Store::connect(&args.store.database_url).await?;
    let result = match interval {
        None => store
            .rack_summaries()
            .await
            .map(|racks| print!("{}", render(&racks, style)))
            .map_err(anyhow::Error::from),
        Some(every) => watch(&store, style, every).await,
    };
    store.close().await;
    result
}

async fn watch(store: &Store, style: Style, every: Duration) -> anyhow::Result<()> {
    // At a terminal indicatif redraws the whole table in place; piped, each refresh is
    // printed after the previous one, separated by a blank line.
    let bar = (style != Style::Plain).then(|| {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stdout());
        bar.set_style(
            ProgressStyle::with_template("{msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar
    });
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let racks = store.rack_summaries().await?;
        let text = render(&racks, style);
        match &bar {
            Some(bar) => bar.set_message(format!(
                "{}\n(refreshing every {:.1} s; Ctrl-C to stop)",
                text.trim_end(),
                every.as_secs_f64()
            )),
            None => println!("{text}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = &mut ctrl_c => break,
        }
    }
    if let Some(bar) = bar {
        bar.abandon();
    }
    Ok(())
}

/// The whole report: one line per rack and a totals line.
pub fn render(racks: &[RackSummary], style: Style) -> String {
    let mut out = String::new();
    if racks.is_empty() {
        out.push_str(
            "no racks in the store yet (register a manifest with `kiln intake register`)\n",
        );
        return out;
    }
    let all = totals(racks);
    let name_w = racks
        .iter()
        .map(|r| r.rack.len())
        .max()
        .unwrap_or(0)
        .max("TOTAL".len())
        .max("RACK".len());
    match style {
        Style::Plain => {
            let _ = write!(out, "{:<name_w$} {:>6}", "RACK", "TOTAL");
            for s in ORDER {
                let _ = write!(out, " {:>w$}", s.as_str().to_uppercase(), w = col_w(s));
            }
            out.push_str(" FINISHED%\n");
            for r in racks.iter().chain(std::iter::once(&all)) {
                let name = if std::ptr::eq(r, &all) {
                    "TOTAL"
                } else {
                    r.rack.as_str()
                };
                let _ = write!(out, "{name:<name_w$} {:>6}", r.total());
                for s in ORDER {
                    let _ = write!(out, " {:>w$}", r.count(s), w = col_w(s));
                }
                let _ = writeln!(out, " {:>9}", percent(r.finished(), r.total()));
            }
        }
        Style::Bars { width, color } => {
            for r in racks.iter().chain(std::iter::once(&all)) {
                let total_line = std::ptr::eq(r, &all);
                if total_line {
                    let _ = writeln!(out, "{}", "-".repeat(name_w + width + 3));
                }
                let name = if total_line { "TOTAL" } else { r.rack.as_str() };
                let _ = write!(
                    out,
                    "{name:<name_w$} {} {:>5}%  {:>5} nodes ",
                    bar(r, width, color),
                    percent(r.finished(), r.total()),
                    r.total()
                );
                let parts: Vec<String> = ORDER
                    .iter()
                    .map(|s| {
                        paint(
                            &format!("{} {}", short(*s), r.count(*s)),
                            *s,
                            color && r.count(*s) > 0,
                        )
                    })
                    .collect();
                let _ = writeln!(out, " {}", parts.join("  "));
            }
        }
    }
    out
}

fn col_w(s: NodeState) -> usize {
    s.as_str().len().max(6)
}

fn short(s: NodeState) -> &'static str {
    match s {
        NodeState::DeadLettered => "dead",
        other => other.as_str(),
    }
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0.0".into();
    }
    format!("{:.1}", part as f64 * 100.0 / whole as f64)
}

fn paint(text: &str, s: NodeState, color: bool) -> String {
    if !color {
        return text.to_string();
    }
    let code = match s {
        NodeState::Passed => "32",
        NodeState::DeadLettered => "31",
        NodeState::Running => "33",
        NodeState::Retrying => "35",
        NodeState::Queued => "90",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

/// Cells per state, `width` in all for a non-empty rack, by largest remainder so the cells add
/// up exactly and any state with nodes gets at least its fair share rounded down.
pub fn cells(r: &RackSummary, width: usize) -> Vec<(NodeState, usize)> {
    let total = r.total();
    if total == 0 {
        return ORDER.iter().map(|s| (*s, 0)).collect();
    }
    let w = width as u64;
    let mut parts: Vec<(NodeState, usize, u64)> = ORDER
        .iter()
        .map(|s| {
            let exact = r.count(*s) * w;
            (*s, (exact / total) as usize, exact % total)
        })
        .collect();
    let mut left = width - parts.iter().map(|p| p.1).sum::<usize>();
    let mut by_rem: Vec<usize> = (0..parts.len()).collect();
    by_rem.sort_by(|a, b| parts[*b].2.cmp(&parts[*a].2).then(a.cmp(b)));
    for i in by_rem {
        if left == 0 {
            break;
        }
        if parts[i].2 > 0 {
            parts[i].1 += 1;
            left -= 1;
        }
    }
    parts.into_iter().map(|(s, n, _)| (s, n)).collect()
}

fn bar(r: &RackSummary, width: usize, color: bool) -> String {
    let mut out = String::from("[");
    let cells = cells(r, width);
    let used: usize = cells.iter().map(|c| c.1).sum();
    for (s, n) in cells {
        if n == 0 {
            continue;
        }
        let glyph = if s == NodeState::Queued { "░" } else { "█" };
        out.push_str(&paint(&glyph.repeat(n), s, color));
    }
    out.push_str(&" ".repeat(width - used));
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rack(name: &str, counts: &[(NodeState, u64)]) -> RackSummary {
        let mut r = RackSummary::new(name);
        for (s, n) in counts {
            r.counts.insert(*s, *n);
        }
        r
    }

    fn sample() -> Vec<RackSummary> {
        vec![
            rack(
                "rack-a",
                &[
                    (NodeState::Passed, 2),
                    (NodeState::Queued, 1),
                    (NodeState::DeadLettered, 1),
                ],
            ),
            rack("rack-longer-name", &[(NodeState::Running, 3)]),
        ]
    }

    #[test]
    fn plain_output_is_aligned_columns_with_totals() {
        let text = render(&sample(), Style::Plain);
        let expected = "\
RACK              TOTAL PASSED DEAD_LETTERED RUNNING RETRYING QUEUED FINISHED%
rack-a                4      2             1       0        0      1      75.0
rack-longer-name      3      0             0       3        0      0       0.0
TOTAL                 7      2             1       3        0      1      42.9
";
        assert_eq!(text, expected);
        assert!(!text.contains('\x1b'));
    }

    #[test]
    fn bars_add_up_and_are_coloured_only_when_asked() {
        let racks = sample();
        let cells = cells(&racks[0], 30);
        assert_eq!(cells.iter().map(|c| c.1).sum::<usize>(), 30);
        // 2/4 passed, 1/4 dead, 1/4 queued of 30 cells: 15, 7 or 8, 8 or 7.
        assert_eq!(cells[0], (NodeState::Passed, 15));
        assert_eq!(cells[1].1 + cells[4].1, 15);
        let text = render(
            &racks,
            Style::Bars {
                width: 30,
                color: false,
            },
        );
        let first = text.lines().next().expect("a line");
        assert_eq!(
            first,
            format!(
                "rack-a           [{}{}{}]  75.0%      4 nodes  passed 2  dead 1  running 0  retrying 0  queued 1",
                "█".repeat(15),
                "█".repeat(cells[1].1),
                "░".repeat(cells[4].1)
            )
        );
        assert!(text.lines().last().expect("total").starts_with("TOTAL "));
        assert!(!text.contains('\x1b'));
        let coloured = render(
            &racks,
            Style::Bars {
                width: 30,
                color: true,
            },
        );
        assert!(coloured.contains("\x1b[32m") && coloured.contains("\x1b[31m"));
        assert_eq!(cells_of_empty(), 0);
    }

    fn cells_of_empty() -> usize {
        cells(&RackSummary::new("e"), 30).iter().map(|c| c.1).sum()
    }

    #[test]
    fn an_empty_store_says_so() {
        assert!(render(&[], Style::Plain).starts_with("no racks in the store yet"));
    }
}
