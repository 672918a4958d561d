//! Prometheus text exposition, format 0.0.4, as served by the broker's and the agents'
//! `GET /metrics`. Kiln's metrics are a few dozen families computed when scraped, so a small
//! writer over plain values is all that is needed; the counters themselves are atomics or
//! fields owned by the code that moves them (docs/dependencies.md says why no client crate).
//!
//! The writer keeps the rules that parsers check: one `# HELP` and `# TYPE` per family before
//! its samples, label values escaped, histogram buckets cumulative and ending in `+Inf`.
//! [`serve`] is the `GET /metrics` endpoint itself, the same for the broker and the agents.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A sample value, printed the way the text format reads it (`+Inf`, `-Inf`, `NaN`).
pub trait Value {
    fn write_to(&self, out: &mut String);
}

impl Value for f64 {
    fn write_to(&self, out: &mut String) {
        if self.is_nan() {
            out.push_str("NaN");
        } else if self.is_infinite() {
            out.push_str(if *self > 0.0 { "+Inf" } else { "-Inf" });
        } else {
            let _ = write!(out, "{self}");
        }
    }
}

macro_rules! integer_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            fn write_to(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
integer_value!(u64, i64, u32, i32, usize);

/// Builds one exposition document.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a family: its `# HELP` and `# TYPE` lines. Call once per family, before its samples.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
        self
    }

    /// One sample line: `name{label="value",...} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Value) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        self.out.push(' ');
        value.write_to(&mut self.out);
        self.out.push('\n');
        self
    }

    /// A family with a single unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: impl Value) -> &mut Self {
        self.family(name, kind, help).sample(name, &[], value)
    }

    /// The samples of one histogram series (the family line must come first): `_bucket` per
    /// bound plus `+Inf`, `_sum` and `_count`.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramData<'_>) {
        let bucket = format!("{name}_bucket");
        let bounds = h.bounds.iter().map(|b| le_label(*b));
        let les: Vec<String> = bounds.chain(["+Inf".to_string()]).collect();
        let counts = h.cumulative.iter().copied().chain([h.count]);
        for (le, count) in les.iter().zip(counts) {
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", le));
            self.sample(&bucket, &with_le, count);
        }
        self.sample(&format!("{name}_sum"), labels, h.sum);
        self.sample(&format!("{name}_count"), labels, h.count);
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// A histogram's values as the text format wants them.
#[derive(Debug, Clone, Copy)]
pub struct HistogramData<'a> {
    /// Upper bounds, ascending.
    pub bounds: &'a [f64],
    /// Cumulative counts, one per bound, each at most `count`.
    pub cumulative: &'a [u64],
    pub count: u64,
    pub sum: f64,
}

/// A fixed-bucket histogram for series kept behind a lock (the atomics-only one for fsync
/// timing lives in `kiln_log::stats`, which must not depend on metrics code).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative; the last slot is above every bound.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        let slot = self
            .bounds
            .iter()
            .position(|&b| value <= b)
            .unwrap_or(self.bounds.len());
        self.counts[slot] += 1;
        self.sum += value;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Cumulative counts per bound.
    pub fn cumulative(&self) -> Vec<u64> {
        let mut running = 0;
        self.counts[..self.bounds.len()]
            .iter()
            .map(|c| {
                running += c;
                running
            })
            .collect()
    }

    /// Writes this histogram's samples under `name` with `labels`.
    pub fn write(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        let cumulative = self.cumulative();
        out.histogram(
            name,
            labels,
            &HistogramData {
                bounds: self.bounds,
                cumulative: &cumulative,
                count: self.count,
                sum: self.sum,
            },
        );
    }
}

/// Renders one exposition document per scrape.
type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `GET /metrics` on `listener` until the server stops, each scrape answered with what
/// `render` returns at that moment. Rendering runs on the blocking pool: the broker's reads
/// record timestamps from disk and sizes every segment, which must not stall async workers.
pub async fn serve(listener: TcpListener, render: impl Fn() -> String + Send + Sync + 'static) {
    let address = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(%address, "serving metrics on http://{address}/metrics");
    let render: Render = Arc::new(render);
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(render);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "metrics endpoint stopped");
    }
}

async fn scrape(State(render): State<Render>) -> impl IntoResponse {
    match tokio::task::spawn_blocking(move || render()).await {
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], body),
        // A panic while rendering: answer the scrape rather than drop the connection.
        Err(e) => {
            tracing::error!(error = %e, "computing metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, CONTENT_TYPE)],
                "metrics computation failed\n".to_string(),
            )
        }
    }
}

/// A label value with `\`, `"` and newlines escaped.
pub fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// HELP text escapes only `\` and newlines.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A bucket bound as Prometheus' own clients print it (`0.005`, `1.0`).
fn le_label(bound: f64) -> String {
    if bound.is_infinite() {
        "+Inf".to_string()
    } else if bound.fract() == 0.0 {
        format!("{bound:.1}")
    } else {
        format!("{bound}")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn families_and_samples() {
        let mut e = Exposition::new();
        e.family("kiln_x_total", Kind::Counter, "Things.\nDone.")
            .sample("kiln_x_total", &[("topic", "a\"b")], 3u64)
            .sample("kiln_x_total", &[("topic", "c"), ("p", "1")], 4u64);
        e.single("kiln_up", Kind::Gauge, "Up.", f64::INFINITY);
        e.single("kiln_ratio", Kind::Gauge, "Ratio.", 0.25f64);
        assert_eq!(
            e.finish(),
            "# HELP kiln_x_total Things.\\nDone.\n# TYPE kiln_x_total counter\n\
             kiln_x_total{topic=\"a\\\"b\"} 3\nkiln_x_total{topic=\"c\",p=\"1\"} 4\n\
             # HELP kiln_up Up.\n# TYPE kiln_up gauge\nkiln_up +Inf\n\
             # HELP kiln_ratio Ratio.\n# TYPE kiln_ratio gauge\nkiln_ratio 0.25\n"
        );
    }

    /// One HTTP/1.1 GET over a raw socket: the whole response, headers and body.
    async fn get(address: std::net::SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn serves_each_scrape_rendered_then() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let counted = std::sync::atomic::AtomicU64::new(0);
        let server = tokio::spawn(serve(listener, move || {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let mut e = Exposition::new();
            e.single("kiln_scrapes_total", Kind::Counter, "Scrapes.", n);
            e.finish()
        }));
        for n in 1..=2 {
            let response = get(address, "/metrics").await;
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
            let content_type = format!("content-type: {CONTENT_TYPE}");
            assert!(
                response.to_ascii_lowercase().contains(&content_type),
                "{response}"
            );
            assert!(
                response.ends_with(&format!("\nkiln_scrapes_total {n}\n")),
                "{response}"
            );
        }
        let missing = get(address, "/other").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        server.abort();
    }

    #[tokio::test]
    async fn a_failed_render_answers_500() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, || panic!("render failed")));
        let response = get(address, "/metrics").await;
        assert!(response.starts_with("HTTP/1.1 500"), "{response}");
        assert!(
            response.ends_with("metrics computation failed\n"),
            "{response}"
        );
        server.abort();
    }

    #[test]
    fn histogram_is_cumulative_and_ends_in_inf() {
        static BOUNDS: [f64; 3] = [0.5, 1.0, 10.0];
        let mut h = Histogram::new(&BOUNDS);
        for v in [0.1, 0.5, 0.7, 20.0] {
            h.observe(v);
        }
        assert_eq!(h.cumulative(), vec![2, 3, 3]);
        let mut e = Exposition::new();
        e.family("kiln_d_seconds", Kind::Histogram, "D.");
        h.write(&mut e, "kiln_d_seconds", &[("check", "gpu")]);
        let text = e.finish();
        let lines: Vec<&str> = text.lines().skip(2).collect();
        assert_eq!(
            lines,
            [
                "kiln_d_seconds_bucket{check=\"gpu\",le=\"0.5\"} 2",
                "kiln_d_seconds_bucket{check=\"gpu\",le=\"1.0\"} 3",
                "kiln_d_seconds_bucket{check=\"gpu\",le=\"10.0\"} 3",
                "kiln_d_seconds_bucket{check=\"gpu\",le=\"+Inf\"} 4",
                "kiln_d_seconds_sum{check=\"gpu\"} 21.3",
                "kiln_d_seconds_count{check=\"gpu\"} 4",
            ]
        );
    }
}
