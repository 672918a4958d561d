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

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use hdrhistogram::Histogram;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};

const TOPIC: &str = "bench";
/// Raft timings written into every cluster node's `[cluster]` section: those of the shipped
/// configuration (deploy/cluster/broker-*.toml).
const HEARTBEAT_MS: u64 = 100;
const ELECTION_TIMEOUT_MIN_MS: u64 = 300;
const ELECTION_TIMEOUT_MAX_MS: u64 = 600;
const LOG_TAIL_BYTES: u64 = 4096;
/// Longest delivery latency the histogram holds (larger values are clamped).
const LATENCY_US_MAX: u64 = 300_000_000;

#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// The `kiln` binary the brokers run.
    #[arg(long, default_value = "target/release/kiln")]
    pub kiln_bin: PathBuf,
    /// Records produced in each of the two runs.
    #[arg(long, default_value_t = 200_000)]
    pub records: u64,
    #[arg(long, default_value_t = 1024)]
    pub record_bytes: usize,
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Replicas per partition on the three brokers (the standalone broker always has 1).
    #[arg(long, default_value_t = 3)]
    pub replication_factor: i32,
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
    if !args.kiln_bin.is_file() {
        bail!(
            "kiln binary {} not found: build it with `cargo build --release -p kiln --bin kiln` \
             or pass --kiln-bin",
            args.kiln_bin.display()
        );
    }
    if args.partitions < 1 || args.records == 0 || args.record_bytes == 0 || args.in_flight == 0 {
        bail!("--partitions, --records, --record-bytes and --in-flight must be at least 1");
    }
    let kiln_bin = std::fs::canonicalize(&args.kiln_bin)
        .with_context(|| format!("resolving {}", args.kiln_bin.display()))?;
    let tmp = tempfile::tempdir_in(dir)?;
    let ready = Duration::from_secs(args.ready_timeout_s);

    let cluster = {
        let mut brokers = Brokers::start_cluster(&kiln_bin, &tmp.path().join("cluster"), 3)?;
        let figures = measure(
            &mut brokers,
            args,
            args.replication_factor,
            &format!("3 brokers, RF {}", args.replication_factor),
            ready,
            runtime,
        );
        brokers.kill_all();
        figures?
    };
    let single = {
        let mut brokers = Brokers::start_single(&kiln_bin, &tmp.path().join("single"))?;
        let figures = measure(&mut brokers, args, 1, "1 broker, RF 1", ready, runtime);
        brokers.kill_all();
        figures?
    };
    Ok(ClusterFigures {
        cluster,
        single,
        args: args.clone(),
    })
}

fn measure(
    brokers: &mut Brokers,
    args: &ClusterArgs,
    replication_factor: i32,
    setup: &str,
    ready: Duration,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<RunFigures> {
    let deadline = Instant::now() + ready;
    brokers.wait_listening(deadline)?;
    let bootstrap = brokers.bootstrap();
    wait_brokers_listed(brokers, &bootstrap, deadline)?;
    create_topic(
        brokers,
        runtime,
        &bootstrap,
        args.partitions,
        replication_factor,
        deadline,
    )?;
    let leaders = wait_leaders(brokers, &bootstrap, args.partitions, deadline)?;

    let producer = producer(&bootstrap, args)?;
    warm_up(&producer, brokers, args, deadline)?;
    producer.context().reset();

    let payload = vec![0x61u8; args.record_bytes];
    let first_sent_ns = producer.context().now_ns();
    for i in 0..args.records {
        while i.saturating_sub(producer.context().reported()) >= args.in_flight {
            producer.poll(Duration::from_millis(1));
        }
        let partition = (i % args.partitions as u64) as i32;
        let mut record = BaseRecord::<(), [u8], usize>::with_opaque_to(TOPIC, 0)
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
        if i % 1024 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    producer
        .flush(Duration::from_secs(300))
        .with_context(|| format!("{setup}: flushing the producer"))?;
    let ctx = producer.context();
    let ok = ctx.ok.load(Ordering::Relaxed);
    let failed = ctx.failed.load(Ordering::Relaxed);
    if failed > 0 || ok != args.records {
        bail!(
            "{setup}: {ok} of {} records acknowledged, {failed} failed (first error: {})\n{}",
            args.records,
            ctx.first_error().unwrap_or_else(|| "none".into()),
            brokers.log_tails()
        );
    }
    brokers.check_alive()?;
    let elapsed_ns = ctx
        .last_ns
        .load(Ordering::Relaxed)
        .saturating_sub(first_sent_ns);
    let latency_us = ctx.histogram()?;
    Ok(RunFigures {
        setup: setup.to_string(),
        records: ok,
        bytes: ok * args.record_bytes as u64,
        elapsed: Duration::from_nanos(elapsed_ns.max(1)),
        latency_us,
        leaders,
    })
}

// ---------------------------------------------------------------------------- processes

struct BrokerProcess {
    id: i32,
    kafka: String,
    child: Child,
    log_path: PathBuf,
}

/// Broker processes, killed (SIGKILL) when dropped.
struct Brokers {
    procs: Vec<BrokerProcess>,
}

impl Brokers {
    fn start_cluster(kiln: &Path, root: &Path, size: i32) -> anyhow::Result<Brokers> {
        std::fs::create_dir_all(root)?;
        let ports = free_ports(2 * size as usize)?;
        let peers: Vec<(i32, u16, u16)> = (0..size)
            .map(|i| {
                let at = 2 * i as usize;
                (i + 1, ports[at], ports[at + 1])
            })
            .collect();
        let mut brokers = Brokers { procs: Vec::new() };
        for &(id, kafka, raft) in &peers {
            let data_dir = root.join(format!("b{id}"));
            let mut config = node_config(id, kafka, &data_dir);
            config.push_str(&format!(
                "\n[cluster]\nraft_listen = \"127.0.0.1:{raft}\"\ndefault_replication_factor = 3\n\
                 heartbeat_ms = {HEARTBEAT_MS}\nelection_timeout_min_ms = {ELECTION_TIMEOUT_MIN_MS}\n\
                 election_timeout_max_ms = {ELECTION_TIMEOUT_MAX_MS}\n"
            ));
            for &(peer, peer_kafka, peer_raft) in &peers {
                config.push_str(&format!(
                    "\n[[cluster.peers]]\nid = {peer}\nkafka = \"127.0.0.1:{peer_kafka}\"\n\
                     raft = \"127.0.0.1:{peer_raft}\"\n"
                ));
            }
            brokers.spawn(kiln, root, id, kafka, &config)?;
        }
        Ok(brokers)
    }

    fn start_single(kiln: &Path, root: &Path) -> anyhow::Result<Brokers> {
        std::fs::create_dir_all(root)?;
        let ports = free_ports(1)?;
        let mut brokers = Brokers { procs: Vec::new() };
        let config = node_config(1, ports[0], &root.join("b1"));
        brokers.spawn(kiln, root, 1, ports[0], &config)?;
        Ok(brokers)
    }

    fn spawn(
        &mut self,
        kiln: &Path,
        root: &Path,
        id: i32,
        kafka_port: u16,
        config: &str,
    ) -> anyhow::Result<()> {
        let config_path = root.join(format!("b{id}.toml"));
        std::fs::write(&config_path, config)
            .with_context(|| format!("writing {}", config_path.display()))?;
        let log_path = root.join(format!("b{id}.log"));
        let log =
            File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let mut command = Command::new(kiln);
        command
            .arg("broker")
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Settings come from the file alone: no KILN_* variable of the caller may override them.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("KILN_") {
                command.env_remove(name);
            }
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", kiln.display()))?;
        self.procs.push(BrokerProcess {
            id,
            kafka: format!("127.0.0.1:{kafka_port}"),
            child,
            log_path,
        });
        Ok(())
    }

    fn bootstrap(&self) -> String {
        self.procs
            .iter()
            .map(|p| p.kafka.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Fails (with the broker's log) if any broker has exited.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        for p in &mut self.procs {
            if let Some(status) = p.child.try_wait()? {
                bail!(
                    "broker {} exited with {status}\n{}",
                    p.id,
                    log_tail(&p.log_path)
                );
            }
        }
        Ok(())
    }

    fn wait_listening(&mut self, deadline: Instant) -> anyhow::Result<()> {
        for i in 0..self.procs.len() {
            loop {
                self.check_alive()?;
                if TcpStream::connect(&self.procs[i].kafka).is_ok() {
                    break;
                }
                if Instant::now() >= deadline {
                    bail!(
                        "broker {} did not listen on {} in time\n{}",
                        self.procs[i].id,
                        self.procs[i].kafka,
                        log_tail(&self.procs[i].log_path)
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    fn log_tails(&self) -> String {
        self.procs
            .iter()
            .map(|p| format!("[broker {}]\n{}", p.id, log_tail(&p.log_path)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn kill_all(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

impl Drop for Brokers {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// `n` distinct free loopback ports (all bound at once, then released).
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("binding 127.0.0.1:0")?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// The settings every broker gets: id, Kafka listener, data dir, no metrics endpoint.
fn node_config(id: i32, kafka_port: u16, data_dir: &Path) -> String {
    format!(
        "node_id = {id}\nlisten = \"127.0.0.1:{kafka_port}\"\ndata_dir = {}\nmetrics_listen = \"off\"\n",
        toml_string(&data_dir.to_string_lossy())
    )
}

fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn log_tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
        let mut bytes = Vec::new();
        let _ = f.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    format!("--- {} ---\n{text}\n--- end ---", path.display())
}

// ---------------------------------------------------------------------------- the cluster

/// Waits until Metadata lists every broker (the cluster has formed).
fn wait_brokers_listed(
    brokers: &mut Brokers,
    bootstrap: &str,
    deadline: Instant,
) -> anyhow::Result<()> {
    let client = admin_client(bootstrap)?;
    let want = brokers.procs.len();
    loop {
        brokers.check_alive()?;
        let last = match client.inner().fetch_metadata(None, Duration::from_secs(5)) {
            Ok(md) if md.brokers().len() == want => return Ok(()),
            Ok(md) => format!("{} of {want} brokers listed", md.brokers().len()),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            bail!(
                "the brokers did not list each other in time ({last})\n{}",
                brokers.log_tails()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// CreateTopics (librdkafka sends it to the controller), retried while there is none yet or it
/// moves.
fn create_topic(
    brokers: &mut Brokers,
    runtime: &tokio::runtime::Runtime,
    bootstrap: &str,
    partitions: i32,
    replication_factor: i32,
    deadline: Instant,
) -> anyhow::Result<()> {
    let admin = admin_client(bootstrap)?;
    let topic = NewTopic::new(
        TOPIC,
        partitions,
        TopicReplication::Fixed(replication_factor),
    );
    let options = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .request_timeout(Some(Duration::from_secs(10)));
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        brokers.check_alive()?;
        let last = match runtime.block_on(admin.create_topics([&topic], &options)) {
            Ok(results) => match results.into_iter().next() {
                Some(Ok(_)) => return Ok(()),
                // An earlier attempt created it and its answer was lost.
                Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) if attempt > 1 => {
                    return Ok(())
                }
                Some(Err((_, code))) if !retriable(code) => {
                    bail!("creating topic {TOPIC} (RF {replication_factor}) failed: {code}")
                }
                Some(Err((_, code))) => code.to_string(),
                None => "no result".to_string(),
            },
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            bail!(
                "creating topic {TOPIC} did not succeed in time ({attempt} attempts, last: {last})\n{}",
                brokers.log_tails()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn retriable(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::NotController
            | RDKafkaErrorCode::LeaderNotAvailable
            | RDKafkaErrorCode::NotLeaderForPartition
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::BrokerNotAvailable
            | RDKafkaErrorCode::NotEnoughReplicas
            | RDKafkaErrorCode::CoordinatorNotAvailable
            | RDKafkaErrorCode::NotCoordinator
            | RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::AllBrokersDown
    )
}

/// Waits until every partition of the topic has a leader; returns the leader of each.
fn wait_leaders(
    brokers: &mut Brokers,
    bootstrap: &str,
    partitions: i32,
    deadline: Instant,
) -> anyhow::Result<Vec<i32>> {
    let client = admin_client(bootstrap)?;
    loop {
        brokers.check_alive()?;
        let last = match client
            .inner()
            .fetch_metadata(Some(TOPIC), Duration::from_secs(5))
        {
            Ok(md) => {
                let led = md.topics().iter().find(|t| t.name() == TOPIC).map(|t| {
                    let mut leaders = vec![-1; partitions as usize];
                    for p in t.partitions() {
                        if p.error().is_none() && (0..partitions).contains(&p.id()) {
                            leaders[p.id() as usize] = p.leader();
                        }
                    }
                    leaders
                });
                match led {
                    Some(leaders) if leaders.iter().all(|&l| l >= 0) => return Ok(leaders),
                    Some(leaders) => format!("leaders {leaders:?}"),
                    None => "topic not listed".to_string(),
                }
            }
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            bail!(
                "not every partition of {TOPIC} had a leader in time ({last})\n{}",
                brokers.log_tails()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn admin_client(bootstrap: &str) -> anyhow::Result<AdminClient<DefaultClientContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .create()
        .context("creating a librdkafka admin client")
}

// ---------------------------------------------------------------------------- the producer

/// Counts delivery reports and records each record's latency (the opaque is its send time).
struct BenchContext {
    started: Instant,
    ok: AtomicU64,
    failed: AtomicU64,
    last_ns: AtomicU64,
    latency_us: Mutex<Histogram<u64>>,
    first_error: Mutex<Option<String>>,
}

impl BenchContext {
    fn new() -> anyhow::Result<BenchContext> {
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
    fn reset(&self) {
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
    fn reported(&self) -> u64 {
        self.ok.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed)
    }

    fn first_error(&self) -> Option<String> {
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

fn producer(bootstrap: &str, args: &ClusterArgs) -> anyhow::Result<BaseProducer<BenchContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("acks", "all")
        // InitProducerId is not implemented by the broker yet.
        .set("enable.idempotence", "false")
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
fn warm_up(
    producer: &BaseProducer<BenchContext>,
    brokers: &mut Brokers,
    args: &ClusterArgs,
    deadline: Instant,
) -> anyhow::Result<()> {
    let payload = vec![0x62u8; args.record_bytes];
    loop {
        producer.context().reset();
        for partition in 0..args.partitions {
            let record = BaseRecord::<(), [u8], usize>::with_opaque_to(TOPIC, 0)
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
    let a = &f.args;
    println!(
        "cluster  {} records of {} B per run, {} partitions, acks=all, one librdkafka producer \
         (linger.ms={}, batch.size={}, at most {} records in flight)",
        a.records, a.record_bytes, a.partitions, a.linger_ms, a.batch_bytes, a.in_flight
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
