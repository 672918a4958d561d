//! Three `kiln broker` processes with replication factor 3 beside one standalone broker.
//!
//! The brokers are real processes (the binary from `--kiln-bin`) on loopback, each with its own
//! data directory under a temporary directory inside `--dir`. The three-broker cluster is the
//! configuration `kiln broker --config FILE` takes (a `[cluster]` section with the same peer
//! list on every node); the standalone broker has no `[cluster]` section. One librdkafka
//! producer (acks=all, tuned for throughput) writes the same number of 1 KiB records to each,
//! spread round-robin over the topic's partitions, and the two runs are printed side by side
//! with their ratio. Latency is per record: handed to librdkafka -> delivery report (so it
//! includes linger and batching), with at most `--in-flight` records outstanding. Every broker
//! is killed at the end, on error too.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use hdrhistogram::Histogram;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};

use crate::brokers::{self, Brokers, TopicSpec};

pub(crate) const TOPIC: &str = "bench";
/// Longest delivery latency the histogram holds (larger values are clamped).
const LATENCY_US_MAX: u64 = 300_000_000;

/// The producer's load and the brokers it runs against, shared by the multi-process
/// benchmarks.
#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    /// The `kiln` binary the brokers run.
    #[arg(long, default_value = "target/release/kiln")]
    pub kiln_bin: PathBuf,
    #[arg(long, default_value_t = 1024)]
    pub record_bytes: usize,
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// librdkafka `linger.ms`.
    #[arg(long, default_value_t = 5)]
    pub linger_ms: u32,
    /// librdkafka `batch.size` (bytes per partition batch).
    #[arg(long, default_value_t = 1_000_000)]
    pub batch_bytes: u32,
    /// Records handed to librdkafka and not yet acknowledged, at most. Latency is measured
    /// inside this window (at saturation it is about in-flight / throughput).
    #[arg(long, default_value_t = 10_000)]
    pub in_flight: u64,
    /// Longest wait for the brokers to listen, the cluster to form and the topic to be led.
    #[arg(long, default_value_t = 60)]
    pub ready_timeout_s: u64,
    /// librdkafka `enable.idempotence` (its default is false).
    #[arg(long, default_value_t = false)]
    pub idempotence: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Records produced in each of the two runs.
    #[arg(long, default_value_t = 200_000)]
    pub records: u64,
    /// Replicas per partition on the three brokers (the standalone broker always has 1).
    #[arg(long, default_value_t = 3)]
    pub replication_factor: i32,
}

/// One run: how fast the records were acknowledged.
pub struct RunFigures {
    pub setup: String,
    pub records: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    pub latency_us: Histogram<u64>,
    /// Broker id leading each partition when the run started.
    pub leaders: Vec<i32>,
}

pub struct ClusterFigures {
    pub cluster: RunFigures,
    pub single: RunFigures,
    pub args: ClusterArgs,
}

pub fn run(
    dir: &Path,
    args: &ClusterArgs,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<ClusterFigures> {
    check_args(args)?;
    let kiln_bin = kiln_bin(&args.load.kiln_bin)?;
    let tmp = tempfile::tempdir_in(dir)?;
    let cluster = {
        let mut brokers = Brokers::start_cluster(&kiln_bin, &tmp.path().join("cluster"), 3, "")?;
        let setup = format!("3 brokers, RF {}", args.replication_factor);
        let figures = measure(&mut brokers, args, args.replication_factor, &setup, runtime);
        brokers.kill_all();
        figures?
    };
    let single = {
        let mut brokers = Brokers::start_single(&kiln_bin, &tmp.path().join("single"), "")?;
        let figures = measure(&mut brokers, args, 1, "1 broker, RF 1", runtime);
        brokers.kill_all();
        figures?
    };
    Ok(ClusterFigures {
        cluster,
        single,
        args: args.clone(),
    })
}

fn check_args(args: &ClusterArgs) -> anyhow::Result<()> {
    if args.records == 0 {
        bail!("--records must be at least 1");
    }
    check_load(&args.load)
}

pub(crate) fn check_load(load: &LoadArgs) -> anyhow::Result<()> {
    if load.partitions < 1 || load.record_bytes == 0 || load.in_flight == 0 {
        bail!("--partitions, --record-bytes and --in-flight must be at least 1");
    }
    Ok(())
}

/// The `kiln` binary the brokers run, resolved (they start in other directories).
pub(crate) fn kiln_bin(path: &Path) -> anyhow::Result<PathBuf> {
    if !path.is_file() {
        bail!(
            "kiln binary {} not found: build it with `cargo build --release -p kiln --bin kiln` \
             or pass --kiln-bin",
            path.display()
        );
    }
    std::fs::canonicalize(path).with_context(|| format!("resolving {}", path.display()))
}

/// Waits for the brokers, creates `spec`'s topic and waits until every partition is led;
/// returns the bootstrap list and the leaders.
pub(crate) fn prepare(
    brokers: &mut Brokers,
    spec: &TopicSpec<'_>,
    ready: Duration,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<(String, Vec<i32>)> {
    let deadline = Instant::now() + ready;
    brokers.wait_listening(deadline)?;
    let bootstrap = brokers.bootstrap();
    brokers::wait_brokers_listed(brokers, &bootstrap, deadline)?;
    brokers::create_topic(brokers, runtime, &bootstrap, spec, deadline)?;
    let leaders = brokers::wait_leaders(brokers, &bootstrap, spec.name, spec.partitions, deadline)?;
    Ok((bootstrap, leaders))
}

/// `args.records` records through a fresh producer (idempotent or not) to a new topic.
pub(crate) fn measure(
    brokers: &mut Brokers,
    args: &ClusterArgs,
    replication_factor: i32,
    setup: &str,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<RunFigures> {
    let load = &args.load;
    let spec = TopicSpec {
        name: TOPIC,
        partitions: load.partitions,
        replication_factor,
        configs: &[],
    };
    let ready = Duration::from_secs(load.ready_timeout_s);
    let (bootstrap, leaders) = prepare(brokers, &spec, ready, runtime)?;
    let producer = producer(&bootstrap, load)?;
    warm_up(&producer, brokers, TOPIC, load, Instant::now() + ready)?;
    producer.context().reset();

    let first_sent_ns = producer.context().now_ns();
    let records = args.records;
    drive(&producer, TOPIC, load, setup, &mut |sent, _| {
        sent >= records
    })?;
    finish(&producer, brokers, setup, records)?;
    let ctx = producer.context();
    let elapsed_ns = ctx
        .last_ns
        .load(Ordering::Relaxed)
        .saturating_sub(first_sent_ns);
    let ok = ctx.ok.load(Ordering::Relaxed);
    Ok(RunFigures {
        setup: setup.to_string(),
        records: ok,
        bytes: ok * load.record_bytes as u64,
        elapsed: Duration::from_nanos(elapsed_ns.max(1)),
        latency_us: ctx.histogram()?,
        leaders,
    })
}

/// Sends records of `args.record_bytes` round-robin over `topic`'s partitions, at most
/// `args.in_flight` unacknowledged, until `done(sent, context)` says so (asked before each
/// record); returns the number sent. Delivery reports are counted by the producer's context.
pub(crate) fn drive(
    producer: &BaseProducer<BenchContext>,
    topic: &str,
    args: &LoadArgs,
    setup: &str,
    done: &mut dyn FnMut(u64, &BenchContext) -> bool,
) -> anyhow::Result<u64> {
    let payload = vec![0x61u8; args.record_bytes];
    let mut i = 0u64;
    while !done(i, producer.context()) {
        while i.saturating_sub(producer.context().reported()) >= args.in_flight {
            producer.poll(Duration::from_millis(1));
        }
        let partition = (i % args.partitions as u64) as i32;
        let mut record = BaseRecord::<(), [u8], usize>::with_opaque_to(topic, 0)
            .payload(&payload[..])
            .partition(partition);
        loop {
            record.delivery_opaque = producer.context().now_ns() as usize;
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(1));
                }
                Err((e, _)) => bail!("{setup}: producing record {i} failed: {e}"),
            }
        }
        if i.is_multiple_of(1024) {
            producer.poll(Duration::ZERO);
        }
        i += 1;
    }
    Ok(i)
}

/// A producer writing in the background: records of `load.record_bytes` round-robin over a
/// topic's partitions from a thread of its own, paced to `rate` records/s (unpaced without
/// one), until stopped.
pub(crate) struct Live {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<u64>>,
    producer: Arc<BaseProducer<BenchContext>>,
}

impl Live {
    pub(crate) fn start(
        bootstrap: &str,
        topic: &str,
        load: LoadArgs,
        rate: Option<u64>,
    ) -> anyhow::Result<Live> {
        let producer = Arc::new(producer(bootstrap, &load)?);
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s, topic) = (producer.clone(), stop.clone(), topic.to_string());
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            drive(&p, &topic, &load, "live", &mut |i, _| {
                if let Some(rate) = rate {
                    while !s.load(Ordering::Relaxed)
                        && i as f64 > started.elapsed().as_secs_f64() * rate as f64
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                s.load(Ordering::Relaxed)
            })
        });
        Ok(Live {
            stop,
            thread,
            producer,
        })
    }

    /// Records acknowledged so far.
    pub(crate) fn acknowledged(&self) -> u64 {
        self.producer.context().ok.load(Ordering::Relaxed)
    }

    /// Stops it and fails unless every record it sent was acknowledged.
    pub(crate) fn stop(self, brokers: &mut Brokers) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let sent = match self.thread.join() {
            Ok(sent) => sent?,
            Err(_) => bail!("the live producer's thread panicked"),
        };
        finish(&self.producer, brokers, "live", sent)
    }
}

/// Flushes and fails unless every one of `sent` records was acknowledged.
pub(crate) fn finish(
    producer: &BaseProducer<BenchContext>,
    brokers: &mut Brokers,
    setup: &str,
    sent: u64,
) -> anyhow::Result<()> {
    producer
        .flush(Duration::from_secs(300))
        .with_context(|| format!("{setup}: flushing the producer"))?;
    let ctx = producer.context();
    let ok = ctx.ok.load(Ordering::Relaxed);
    let failed = ctx.failed.load(Ordering::Relaxed);
    if failed > 0 || ok != sent {
        bail!(
            "{setup}: {ok} of {sent} records acknowledged, {failed} failed (first error: {})\n{}",
            ctx.first_error().unwrap_or_else(|| "none".into()),
            brokers.log_tails()
        );
    }
    brokers.check_alive()
}

/// Counts delivery reports and records each record's latency (the opaque is its send time).
pub(crate) struct BenchContext {
    started: Instant,
    pub(crate) ok: AtomicU64,
    pub(crate) failed: AtomicU64,
    last_ns: AtomicU64,
    latency_us: Mutex<Histogram<u64>>,
    first_error: Mutex<Option<String>>,
}

impl BenchContext {
    pub(crate) fn new() -> anyhow::Result<BenchContext> {
        Ok(BenchContext {
            started: Instant::now(),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            last_ns: AtomicU64::new(0),
            latency_us: Mutex::new(Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)?),
            first_error: Mutex::new(None),
        })
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Forgets the warm-up's reports.
    pub(crate) fn reset(&self) {
        self.ok.store(0, Ordering::Relaxed);
        self.failed.store(0, Ordering::Relaxed);
        self.last_ns.store(0, Ordering::Relaxed);
        if let Ok(mut h) = self.latency_us.lock() {
            h.reset();
        }
        if let Ok(mut e) = self.first_error.lock() {
            *e = None;
        }
    }

    /// Delivery reports so far, success or failure.
    pub(crate) fn reported(&self) -> u64 {
        self.ok.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed)
    }

    pub(crate) fn first_error(&self) -> Option<String> {
        self.first_error.lock().ok().and_then(|e| e.clone())
    }

    fn histogram(&self) -> anyhow::Result<Histogram<u64>> {
        self.latency_us
            .lock()
            .map(|h| h.clone())
            .map_err(|_| anyhow::anyhow!("latency histogram lock poisoned"))
    }
}

impl ClientContext for BenchContext {}

impl ProducerContext for BenchContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, sent_ns: usize) {
        let now = self.now_ns();
        self.last_ns.fetch_max(now, Ordering::Relaxed);
        match result {
            Ok(_) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                let us = (now.saturating_sub(sent_ns as u64) / 1000).max(1);
                if let Ok(mut h) = self.latency_us.lock() {
                    h.saturating_record(us);
                }
            }
            Err((e, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first_error.lock() {
                    first.get_or_insert_with(|| e.to_string());
                }
            }
        }
    }
}

pub(crate) fn producer(
    bootstrap: &str,
    args: &LoadArgs,
) -> anyhow::Result<BaseProducer<BenchContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("acks", "all")
        // librdkafka's default is off; with it on, at most 5 requests in flight per connection.
        .set("enable.idempotence", args.idempotence.to_string())
        .set("linger.ms", args.linger_ms.to_string())
        .set("batch.size", args.batch_bytes.to_string())
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "500000")
        .set("queue.buffering.max.kbytes", "1048576")
        .set("compression.type", "none")
        .set("message.timeout.ms", "120000")
        .create_with_context(BenchContext::new()?)
        .context("creating the librdkafka producer")
}

/// One acknowledged record per partition before the clock starts: connections are open and
/// every leader has taken a write.
pub(crate) fn warm_up(
    producer: &BaseProducer<BenchContext>,
    brokers: &mut Brokers,
    topic: &str,
    args: &LoadArgs,
    deadline: Instant,
) -> anyhow::Result<()> {
    let payload = vec![0x62u8; args.record_bytes];
    loop {
        producer.context().reset();
        for partition in 0..args.partitions {
            let record = BaseRecord::<(), [u8], usize>::with_opaque_to(topic, 0)
                .payload(&payload[..])
                .partition(partition);
            if let Err((e, _)) = producer.send(record) {
                bail!("warm-up produce to partition {partition} failed: {e}");
            }
        }
        producer
            .flush(Duration::from_secs(30))
            .context("flushing the warm-up records")?;
        let ok = producer.context().ok.load(Ordering::Relaxed);
        if ok == args.partitions as u64 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "warm-up: {ok} of {} partitions took a write (first error: {})\n{}",
                args.partitions,
                producer
                    .context()
                    .first_error()
                    .unwrap_or_else(|| "none".into()),
                brokers.log_tails()
            );
        }
        brokers.check_alive()?;
        std::thread::sleep(Duration::from_millis(200));
    }
}

// ---------------------------------------------------------------------------- output

pub fn print(f: &ClusterFigures) {
    let a = &f.args.load;
    println!(
        "cluster  {} records of {} B per run, {} partitions, acks=all, one librdkafka producer \
         (linger.ms={}, batch.size={}, at most {} records in flight, idempotence {})",
        f.args.records,
        a.record_bytes,
        a.partitions,
        a.linger_ms,
        a.batch_bytes,
        a.in_flight,
        a.idempotence
    );
    println!(
        "cluster  leaders at the start: {} -> {:?}, {} -> {:?}",
        f.cluster.setup, f.cluster.leaders, f.single.setup, f.single.leaders
    );
    println!(
        "cluster  {:<16} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "setup", "records/s", "MB/s", "MiB/s", "p50 ms", "p99 ms", "seconds"
    );
    for r in [&f.cluster, &f.single] {
        let s = r.elapsed.as_secs_f64();
        println!(
            "cluster  {:<16} {:>12.0} {:>9.1} {:>9.1} {:>9.2} {:>9.2} {:>9.2}",
            r.setup,
            r.records as f64 / s,
            r.bytes as f64 / 1e6 / s,
            r.bytes as f64 / (1u64 << 20) as f64 / s,
            ms(&r.latency_us, 0.5),
            ms(&r.latency_us, 0.99),
            s
        );
    }
    let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { f64::NAN };
    let (c, s) = (&f.cluster, &f.single);
    let (cs, ss) = (c.elapsed.as_secs_f64(), s.elapsed.as_secs_f64());
    println!(
        "cluster  {:<16} {:>12.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
        "ratio RF3/RF1",
        ratio(c.records as f64 / cs, s.records as f64 / ss),
        ratio(c.bytes as f64 / cs, s.bytes as f64 / ss),
        ratio(c.bytes as f64 / cs, s.bytes as f64 / ss),
        ratio(ms(&c.latency_us, 0.5), ms(&s.latency_us, 0.5)),
        ratio(ms(&c.latency_us, 0.99), ms(&s.latency_us, 0.99)),
        ratio(cs, ss)
    );
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}
