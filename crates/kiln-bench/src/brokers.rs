//! Real `kiln broker` processes for the multi-process benchmarks: a three-broker cluster (each
//! with a `[cluster]` section naming the others, the shipped Raft timings) or one standalone
//! broker, on loopback, each with its own data directory and log file. A broker can be killed
//! with SIGKILL and started again on the same directory and ports; its resident memory (now and
//! peak) is read from `/proc`. Every broker is killed when the set is dropped, so a failed run
//! leaves no process behind.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;

/// Raft timings written into every cluster node's `[cluster]` section: those of the shipped
/// configuration (deploy/cluster/broker-*.toml).
const HEARTBEAT_MS: u64 = 100;
const ELECTION_TIMEOUT_MIN_MS: u64 = 300;
const ELECTION_TIMEOUT_MAX_MS: u64 = 600;
/// Longest a metrics scrape may take, connection included.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest metrics page read.
const SCRAPE_BYTES_MAX: u64 = 16 << 20;
/// Bytes of a broker's log shown when it fails.
const LOG_TAIL_BYTES: u64 = 4096;

pub(crate) struct BrokerProcess {
    pub(crate) id: i32,
    pub(crate) kafka: String,
    pub(crate) data_dir: PathBuf,
    /// The metrics endpoint (`host:port`) of a cluster node; a standalone broker has none.
    pub(crate) metrics: Option<String>,
    child: Child,
    kiln: PathBuf,
    config_path: PathBuf,
    log_path: PathBuf,
}

impl BrokerProcess {
    pub(crate) fn log_path(&self) -> &Path {
        &self.log_path
    }
}

/// Broker processes, killed (SIGKILL) when dropped.
pub(crate) struct Brokers {
    pub(crate) procs: Vec<BrokerProcess>,
}

impl Brokers {
    /// `size` brokers forming one cluster; `extra` is appended to every broker's top-level
    /// settings (before its `[cluster]` section).
    pub(crate) fn start_cluster(
        kiln: &Path,
        root: &Path,
        size: i32,
        extra: &str,
    ) -> anyhow::Result<Brokers> {
        std::fs::create_dir_all(root)?;
        let ports = free_ports(3 * size as usize)?;
        let peers: Vec<(i32, u16, u16, u16)> = (0..size)
            .map(|i| {
                let at = 3 * i as usize;
                (i + 1, ports[at], ports[at + 1], ports[at + 2])
            })
            .collect();
        let mut brokers = Brokers { procs: Vec::new() };
        for &(id, kafka, raft, metrics) in &peers {
            let data_dir = root.join(format!("b{id}"));
            let mut config = node_config(id, kafka, &data_dir, Some(metrics), extra);
            config.push_str(&format!(
                "\n[cluster]\nraft_listen = \"127.0.0.1:{raft}\"\ndefault_replication_factor = 3\n\
                 heartbeat_ms = {HEARTBEAT_MS}\nelection_timeout_min_ms = {ELECTION_TIMEOUT_MIN_MS}\n\
                 election_timeout_max_ms = {ELECTION_TIMEOUT_MAX_MS}\n"
            ));
            for &(peer, peer_kafka, peer_raft, _) in &peers {
                config.push_str(&format!(
                    "\n[[cluster.peers]]\nid = {peer}\nkafka = \"127.0.0.1:{peer_kafka}\"\n\
                     raft = \"127.0.0.1:{peer_raft}\"\n"
                ));
            }
            brokers.spawn(kiln, root, id, kafka, &data_dir, &config)?;
            if let Some(last) = brokers.procs.last_mut() {
                last.metrics = Some(format!("127.0.0.1:{metrics}"));
            }
        }
        Ok(brokers)
    }

    pub(crate) fn start_single(kiln: &Path, root: &Path, extra: &str) -> anyhow::Result<Brokers> {
        std::fs::create_dir_all(root)?;
        let ports = free_ports(1)?;
        let mut brokers = Brokers { procs: Vec::new() };
        let data_dir = root.join("b1");
        let config = node_config(1, ports[0], &data_dir, None, extra);
        brokers.spawn(kiln, root, 1, ports[0], &data_dir, &config)?;
        Ok(brokers)
    }

    fn spawn(
        &mut self,
        kiln: &Path,
        root: &Path,
        id: i32,
        kafka_port: u16,
        data_dir: &Path,
        config: &str,
    ) -> anyhow::Result<()> {
        let config_path = root.join(format!("b{id}.toml"));
        std::fs::write(&config_path, config)
            .with_context(|| format!("writing {}", config_path.display()))?;
        let log_path = root.join(format!("b{id}.log"));
        let child = launch(kiln, &config_path, &log_path)?;
        self.procs.push(BrokerProcess {
            id,
            kafka: format!("127.0.0.1:{kafka_port}"),
            data_dir: data_dir.to_path_buf(),
            metrics: None,
            child,
            kiln: kiln.to_path_buf(),
            config_path,
            log_path,
        });
        Ok(())
    }

    pub(crate) fn index_of(&self, id: i32) -> anyhow::Result<usize> {
        self.procs
            .iter()
            .position(|p| p.id == id)
            .with_context(|| format!("no broker {id}"))
    }

    /// SIGKILL, as a power cut would stop it: nothing is flushed or closed.
    pub(crate) fn kill(&mut self, id: i32) -> anyhow::Result<()> {
        let at = self.index_of(id)?;
        let p = &mut self.procs[at];
        p.child
            .kill()
            .with_context(|| format!("killing broker {id}"))?;
        p.child.wait()?;
        Ok(())
    }

    /// Starts a killed broker again with the same settings and directory; its log continues.
    pub(crate) fn restart(&mut self, id: i32) -> anyhow::Result<()> {
        let at = self.index_of(id)?;
        let p = &mut self.procs[at];
        if p.child.try_wait()?.is_none() {
            bail!("broker {id} is still running");
        }
        p.child = launch(&p.kiln, &p.config_path, &p.log_path)?;
        Ok(())
    }

    /// Waits until broker `id` accepts connections on its Kafka port.
    pub(crate) fn wait_listening_one(&mut self, id: i32, deadline: Instant) -> anyhow::Result<()> {
        let at = self.index_of(id)?;
        loop {
            self.check_alive()?;
            if TcpStream::connect(&self.procs[at].kafka).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "broker {id} did not listen on {} in time\n{}",
                    self.procs[at].kafka,
                    log_tail(&self.procs[at].log_path)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Each broker's resident memory now and at its peak (`VmRSS`, `VmHWM`), in KiB.
    pub(crate) fn memory_kib(&self) -> Vec<(i32, Memory)> {
        self.procs
            .iter()
            .map(|p| (p.id, memory_kib(p.child.id())))
            .collect()
    }

    /// Each broker's id and process id.
    pub(crate) fn pids(&self) -> Vec<(i32, u32)> {
        self.procs.iter().map(|p| (p.id, p.child.id())).collect()
    }

    pub(crate) fn bootstrap(&self) -> String {
        self.procs
            .iter()
            .map(|p| p.kafka.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Fails (with the broker's log) if any broker has exited.
    pub(crate) fn check_alive(&mut self) -> anyhow::Result<()> {
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

    pub(crate) fn wait_listening(&mut self, deadline: Instant) -> anyhow::Result<()> {
        let ids: Vec<i32> = self.procs.iter().map(|p| p.id).collect();
        for id in ids {
            self.wait_listening_one(id, deadline)?;
        }
        Ok(())
    }

    pub(crate) fn log_tails(&self) -> String {
        self.procs
            .iter()
            .map(|p| format!("[broker {}]\n{}", p.id, log_tail(&p.log_path)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Lines of every broker's log that contain `needle`, read line by line (a bench run's
    /// logs can be long; nothing but the count is kept).
    pub(crate) fn count_log_lines(&self, needle: &str) -> usize {
        use std::io::BufRead;
        self.procs
            .iter()
            .filter_map(|p| File::open(&p.log_path).ok())
            .map(|f| {
                std::io::BufReader::new(f)
                    .lines()
                    .map_while(Result::ok)
                    .filter(|l| l.contains(needle))
                    .count()
            })
            .sum()
    }

    /// The sum of every sample of metric `family` on broker `id`'s metrics endpoint (one
    /// `GET /metrics`, answered within [`SCRAPE_TIMEOUT`]).
    pub(crate) fn scrape(&self, id: i32, family: &str) -> anyhow::Result<f64> {
        let at = self.index_of(id)?;
        let addr = self.procs[at]
            .metrics
            .as_deref()
            .with_context(|| format!("broker {id} serves no metrics"))?;
        let text = http_get(addr, "/metrics")?;
        let mut sum = 0.0;
        let mut seen = false;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(family) else {
                continue;
            };
            if !(rest.starts_with(' ') || rest.starts_with('{')) {
                continue;
            }
            let value = rest
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .with_context(|| format!("broker {id}: unreadable sample {line:?}"))?;
            sum += value;
            seen = true;
        }
        if !seen {
            bail!("broker {id} reports no {family}");
        }
        Ok(sum)
    }

    pub(crate) fn kill_all(&mut self) {
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

fn launch(kiln: &Path, config_path: &Path, log_path: &Path) -> anyhow::Result<Child> {
    let log = File::options()
        .create(true)
        .append(true)
        .open(log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let mut command = Command::new(kiln);
    command
        .arg("broker")
        .arg("--config")
        .arg(config_path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // Settings come from the file alone: no KILN_* variable of the caller may override them.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KILN_") {
            command.env_remove(name);
        }
    }
    command
        .spawn()
        .with_context(|| format!("starting {}", kiln.display()))
}

/// Resident memory of a process, in KiB (0 when `/proc` cannot tell: it has exited).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Memory {
    pub(crate) rss_kib: u64,
    pub(crate) peak_kib: u64,
}

fn memory_kib(pid: u32) -> Memory {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Memory::default();
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    Memory {
        rss_kib: field("VmRSS:"),
        peak_kib: field("VmHWM:"),
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

/// The settings every broker gets: id, Kafka listener, data dir, the metrics endpoint (off
/// without a port), and `extra`.
fn node_config(
    id: i32,
    kafka_port: u16,
    data_dir: &Path,
    metrics_port: Option<u16>,
    extra: &str,
) -> String {
    let metrics = metrics_port.map_or_else(|| "off".to_string(), |p| format!("127.0.0.1:{p}"));
    format!(
        "node_id = {id}\nlisten = \"127.0.0.1:{kafka_port}\"\ndata_dir = {}\nmetrics_listen = \"{metrics}\"\n{extra}",
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

/// `GET path` over HTTP/1.0 (the server closes the connection after its answer); the body.
fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    use std::io::Write;
    let socket: std::net::SocketAddr = addr.parse().with_context(|| format!("address {addr}"))?;
    let mut stream = TcpStream::connect_timeout(&socket, SCRAPE_TIMEOUT)
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(SCRAPE_TIMEOUT))?;
    stream.set_write_timeout(Some(SCRAPE_TIMEOUT))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut bytes = Vec::new();
    stream
        .take(SCRAPE_BYTES_MAX)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {path} from {addr}"))?;
    let text = String::from_utf8_lossy(&bytes);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("{addr}{path}: no HTTP answer");
    };
    if !head.starts_with("HTTP/1.") || head.split(' ').nth(1) != Some("200") {
        bail!("{addr}{path}: {}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_string())
}

pub(crate) fn log_tail(path: &Path) -> String {
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

/// Waits until Metadata lists every broker (the cluster has formed).
pub(crate) fn wait_brokers_listed(
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

/// Waits until the cluster has formed: every broker, asked alone, names the same controller and
/// the same cluster id. Only then is a topic's creation timed: librdkafka's AdminClient, given a
/// Metadata answer from before the first controller was elected, can wait out its whole
/// request timeout (10 s here) before it asks again, which is the client's start-up, not the
/// creation.
pub(crate) fn wait_formed(
    brokers: &mut Brokers,
    runtime: &tokio::runtime::Runtime,
    deadline: Instant,
) -> anyhow::Result<()> {
    use kafka_protocol::messages::{MetadataRequest, RequestKind, ResponseKind};
    let addrs: Vec<String> = brokers.procs.iter().map(|p| p.kafka.clone()).collect();
    let mut client = kiln_client::admin::Cluster::new(addrs.join(","), Duration::from_secs(5));
    loop {
        brokers.check_alive()?;
        let mut seen = Vec::new();
        for addr in &addrs {
            let asked = runtime.block_on(client.call(
                addr,
                RequestKind::Metadata(MetadataRequest::default().with_topics(Some(Vec::new()))),
            ));
            seen.push(match asked {
                Ok(ResponseKind::Metadata(m)) => {
                    Some((m.controller_id.0, m.cluster_id.map(|c| c.to_string())))
                }
                _ => None,
            });
        }
        let formed = seen.iter().all(|v| {
            v.as_ref()
                .is_some_and(|(c, id)| *c >= 0 && id.is_some() && Some(v) == seen.first())
        });
        if formed {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the cluster did not form in time (controller and cluster id per broker: {seen:?})\n{}",
                brokers.log_tails()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What to create: name, partitions, replication factor and topic configs.
pub(crate) struct TopicSpec<'a> {
    pub(crate) name: &'a str,
    pub(crate) partitions: i32,
    pub(crate) replication_factor: i32,
    pub(crate) configs: &'a [(&'a str, &'a str)],
}

/// CreateTopics (librdkafka sends it to the controller), retried while there is none yet or it
/// moves.
pub(crate) fn create_topic(
    brokers: &mut Brokers,
    runtime: &tokio::runtime::Runtime,
    bootstrap: &str,
    spec: &TopicSpec<'_>,
    deadline: Instant,
) -> anyhow::Result<()> {
    let admin = admin_client(bootstrap)?;
    let name = spec.name;
    let mut topic = NewTopic::new(
        name,
        spec.partitions,
        TopicReplication::Fixed(spec.replication_factor),
    );
    for (k, v) in spec.configs {
        topic = topic.set(k, v);
    }
    let options = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .request_timeout(Some(Duration::from_secs(10)));
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        brokers.check_alive()?;
        let asked = Instant::now();
        let last = match runtime.block_on(admin.create_topics([&topic], &options)) {
            Ok(results) => match results.into_iter().next() {
                Some(Ok(_)) => return Ok(()),
                // An earlier attempt created it and its answer was lost.
                Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) if attempt > 1 => {
                    return Ok(())
                }
                Some(Err((_, code))) if !retriable(code) => bail!(
                    "creating topic {name} (RF {}) failed: {code}",
                    spec.replication_factor
                ),
                Some(Err((_, code))) => code.to_string(),
                None => "no result".to_string(),
            },
            Err(e) => e.to_string(),
        };
        // A retry costs the benchmark's figures up to the request timeout: say so.
        println!(
            "  creating topic {name}: attempt {attempt} failed after {:.2} s: {last}",
            asked.elapsed().as_secs_f64()
        );
        if Instant::now() >= deadline {
            bail!(
                "creating topic {name} did not succeed in time ({attempt} attempts, last: {last})\n{}",
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

/// Waits until every partition of `topic` has a leader; returns the leader of each.
pub(crate) fn wait_leaders(
    brokers: &mut Brokers,
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    deadline: Instant,
) -> anyhow::Result<Vec<i32>> {
    let client = admin_client(bootstrap)?;
    loop {
        brokers.check_alive()?;
        let last = match client
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(5))
        {
            Ok(md) => {
                let led = md.topics().iter().find(|t| t.name() == topic).map(|t| {
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
                "not every partition of {topic} had a leader in time ({last})\n{}",
                brokers.log_tails()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(crate) fn admin_client(bootstrap: &str) -> anyhow::Result<AdminClient<DefaultClientContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .create()
        .context("creating a librdkafka admin client")
}
