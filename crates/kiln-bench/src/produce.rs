//! Produce throughput and latency through a real broker over TCP, acks=all, fsync before ack.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::{Bytes, BytesMut};
use clap::Args;
use hdrhistogram::Histogram;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    CreateTopicsRequest, ProduceRequest, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kiln_broker::{Broker, BrokerConfig};
use kiln_client::Connection;
use tokio::sync::{mpsc, Semaphore};

use crate::disk::DiskFigures;

#[derive(Args, Debug, Clone)]
pub struct ProduceArgs {
    #[arg(long, default_value_t = 1024)]
    pub record_bytes: usize,
    /// Records per batch (one batch per produce request).
    #[arg(long, default_value_t = 128)]
    pub batch_records: usize,
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Produce requests each connection keeps outstanding.
    #[arg(long, default_value_t = 8)]
    pub in_flight: usize,
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Broker flush interval in ms; 0 (default) acknowledges only after fsync.
    #[arg(long, default_value_t = 0)]
    pub flush_interval_ms: u64,
    /// Over mutual TLS: the broker's `[tls]` listener requires a client certificate (a CA and
    /// certificates are made for the run).
    #[arg(long)]
    pub tls: bool,
}

pub struct ProduceFigures {
    pub records: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    pub latency_us: Histogram<u64>,
    /// The process's fsyncs during the run (every log's, the partitions' and the broker's
    /// internal ones): how many, and the seconds they took in all.
    pub fsyncs: u64,
    pub fsync_seconds: f64,
    pub args: ProduceArgs,
}

pub async fn run(dir: &Path, args: &ProduceArgs) -> anyhow::Result<ProduceFigures> {
    let tmp = tempfile::tempdir_in(dir)?;
    let mut config = BrokerConfig {
        listen: "127.0.0.1:0".parse()?,
        data_dir: tmp.path().join("broker"),
        ..BrokerConfig::default()
    };
    config.log.flush_interval_ms = args.flush_interval_ms;
    let tls = if args.tls {
        let (settings, connector) = listener_tls(tmp.path(), true)?;
        config.tls = Some(settings);
        Some(connector)
    } else {
        None
    };
    let bound = Broker::bind(config).await?;
    let address = bound.local_addr()?.to_string();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(bound.run(async {
        let _ = stop_rx.await;
    }));

    let timeout = Duration::from_secs(10);
    let mut admin = Connection::connect_with(&address, timeout, tls.as_ref()).await?;
    let create = CreateTopicsRequest::default().with_topics(vec![CreatableTopic::default()
        .with_name(TopicName(StrBytes::from_static_str("bench")))
        .with_num_partitions(args.partitions)
        .with_replication_factor(1)]);
    match admin
        .call(RequestKind::CreateTopics(create), timeout)
        .await?
    {
        ResponseKind::CreateTopics(r) if r.topics.iter().all(|t| t.error_code == 0) => {}
        other => bail!("creating the bench topic failed: {other:?}"),
    }

    let batch = crate::produce_batch(args.batch_records, args.record_bytes)?;
    let fsyncs_before = kiln_log::stats::fsync_latency();
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let mut workers = Vec::new();
    for c in 0..args.connections {
        let connection = Connection::connect_with(&address, timeout, tls.as_ref()).await?;
        workers.push(tokio::spawn(drive_connection(
            connection,
            batch.clone(),
            args.clone(),
            c as i32 % args.partitions.max(1),
            deadline,
        )));
    }
    let mut latency_us = Histogram::<u64>::new(3)?;
    let mut requests = 0u64;
    for w in workers {
        let (h, n) = w.await.context("worker panicked")??;
        latency_us.add(&h)?;
        requests += n;
    }
    let elapsed = started.elapsed();
    let fsyncs_after = kiln_log::stats::fsync_latency();
    let _ = stop_tx.send(());
    server.await.context("broker task")??;
    let records = requests * args.batch_records as u64;
    Ok(ProduceFigures {
        records,
        bytes: records * args.record_bytes as u64,
        elapsed,
        latency_us,
        fsyncs: fsyncs_after.count.saturating_sub(fsyncs_before.count),
        fsync_seconds: (fsyncs_after.sum_seconds - fsyncs_before.sum_seconds).max(0.0),
        args: args.clone(),
    })
}

/// A CA and the broker's certificate for 127.0.0.1 under `dir`: the broker's `[tls]`
/// settings and the client's connector. With `client_certificates`, the listener requires one
/// and the connector presents one the CA issued (mutual TLS).
pub fn listener_tls(
    dir: &Path,
    client_certificates: bool,
) -> anyhow::Result<(
    kiln_broker::config::ListenerTlsSettings,
    kiln_tls::TlsConnector,
)> {
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs)?;
    let ca = kiln_tls::Ca::generate("bench CA")?;
    ca.write(&certs)?;
    ca.issue_broker(0, &["127.0.0.1".to_string()])?
        .write(&certs, "broker")?;
    let (client_crt, client_key) = (certs.join("client.crt"), certs.join("client.key"));
    if client_certificates {
        ca.issue_client("bench")?.write(&certs, "client")?;
    }
    let settings = kiln_broker::config::ListenerTlsSettings {
        cert_file: certs.join("broker.crt"),
        key_file: certs.join("broker.key"),
        client_ca_file: client_certificates.then(|| certs.join("ca.crt")),
        client_auth: None,
    };
    let identity = client_certificates.then_some((client_crt.as_path(), client_key.as_path()));
    let connector = kiln_tls::client_connector(&certs.join("ca.crt"), identity)?;
    Ok((settings, connector))
}

pub fn encode_batch(count: usize, record_bytes: usize) -> anyhow::Result<Bytes> {
    let value = Bytes::from(vec![0x61u8; record_bytes]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let records: Vec<Record> = (0..count as i64)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i,
            // The encoder starts a new batch whenever offset - sequence changes; keeping it
            // constant with a base sequence of -1 (no idempotence) yields one batch.
            sequence: (i - 1) as i32,
            timestamp: now,
            key: None,
            value: Some(value.clone()),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    let encoded = RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    );
    encoded?;
    let batch = buf.freeze();
    let header = kiln_log::BatchHeader::parse(&batch)?;
    if header.total_len() != batch.len() || header.record_count as usize != count {
        anyhow::bail!("the encoder split {count} records into several batches");
    }
    Ok(batch)
}

/// Keeps `in_flight` produce requests outstanding on one connection until the deadline.
async fn drive_connection(
    connection: Connection,
    batch: Bytes,
    args: ProduceArgs,
    first_partition: i32,
    deadline: Instant,
) -> anyhow::Result<(Histogram<u64>, u64)> {
    let (mut writer, mut reader) = connection.into_split();
    let window = Arc::new(Semaphore::new(args.in_flight));
    let (sent_tx, mut sent_rx) = mpsc::unbounded_channel();
    let reader_window = window.clone();
    let reader_task = tokio::spawn(async move {
        let mut latency = Histogram::<u64>::new(3)?;
        let mut acked = 0u64;
        while let Some((sent, at)) = sent_rx.recv().await {
            let response = reader.recv(&sent).await?;
            let ResponseKind::Produce(r) = response else {
                bail!("unexpected response");
            };
            for p in r
                .responses
                .iter()
                .flat_map(|t| t.partition_responses.iter())
            {
                if p.error_code != 0 {
                    bail!(
                        "produce failed with error code {}: {:?}",
                        p.error_code,
                        p.error_message
                    );
                }
            }
            latency.record((Instant::elapsed(&at).as_micros() as u64).max(1))?;
            acked += 1;
            reader_window.add_permits(1);
        }
        Ok::<_, anyhow::Error>((latency, acked))
    });
    let mut partition = first_partition;
    tokio::pin!(reader_task);
    while Instant::now() < deadline {
        // If the reader fails (a produce error, a closed connection) stop at once with its error
        // instead of waiting for window permits that will never come back.
        let permit = tokio::select! {
            permit = window.acquire() => permit?,
            finished = &mut reader_task => {
                return finished.context("reader panicked")?.and_then(|_| bail!("reader stopped early"));
            }
        };
        permit.forget();
        let request = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("bench")))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(batch.clone()))])]);
        let (sent, frame) = writer.encode(&RequestKind::Produce(request))?;
        let at = Instant::now();
        writer.send_frame(&frame).await?;
        if sent_tx.send((sent, at)).is_err() {
            break;
        }
        partition = (partition + 1) % args.partitions.max(1);
    }
    drop(sent_tx);
    reader_task.await.context("reader panicked")?
}

pub fn print(p: &ProduceFigures, disk: &DiskFigures) {
    let secs = p.elapsed.as_secs_f64();
    let records_s = p.records as f64 / secs;
    let mib_s = p.bytes as f64 / (1 << 20) as f64 / secs;
    let ms = |q: f64| p.latency_us.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "produce  {} B records, {} per batch, {} partitions, {} connections x {} in flight, acks=all, {}",
        p.args.record_bytes,
        p.args.batch_records,
        p.args.partitions,
        p.args.connections,
        p.args.in_flight,
        if p.args.flush_interval_ms == 0 {
            "fsync before ack".to_string()
        } else {
            format!("fsync every {} ms", p.args.flush_interval_ms)
        }
    );
    if p.args.tls {
        println!("produce  over mutual TLS (TLS 1.3, client certificates required)");
    }
    println!(
        "produce  {records_s:.0} records/s, {mib_s:.1} MiB/s over {secs:.1} s ({} records)",
        p.records
    );
    println!(
        "produce  request latency p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
        ms(0.5),
        ms(0.99),
        ms(0.999),
        p.latency_us.max() as f64 / 1000.0
    );
    // How much of the time a partition's log was being fsynced: with acks waiting for the fsync,
    // time the disk spends idle between fsyncs is time no record becomes durable (the standalone
    // path's shortfall against the old engine, docs/benchmarks.md). Internal logs' fsyncs count
    // too; they are few during a produce run.
    if p.fsyncs > 0 {
        println!(
            "produce  fsyncs {:.0}/s, mean {:.2} ms, {:.0} KiB each; the partitions' logs were being fsynced {:.0}% of the time",
            p.fsyncs as f64 / secs,
            1000.0 * p.fsync_seconds / p.fsyncs as f64,
            p.bytes as f64 / 1024.0 / p.fsyncs as f64,
            100.0 * p.fsync_seconds / (secs * f64::from(p.args.partitions.max(1)))
        );
    }
    println!(
        "produce  ratio to the disk's fsync'd sequential bandwidth, 1 stream: {:.0}% ({mib_s:.1} of {:.1} MiB/s)",
        100.0 * mib_s / disk.bandwidth_mib_s,
        disk.bandwidth_mib_s
    );
    println!(
        "produce  ratio to the disk's fsync'd sequential bandwidth, {} streams: {:.0}% ({mib_s:.1} of {:.1} MiB/s)",
        disk.streams,
        100.0 * mib_s / disk.parallel_bandwidth_mib_s,
        disk.parallel_bandwidth_mib_s
    );
}

/// Rounds of each transport in `kiln-bench tls`, alternated so drift in the disk or the machine
/// falls on both.
const TLS_ROUNDS: usize = 2;

/// `kiln-bench tls`: the same produce run over plain TCP and over mutual TLS, alternated, and
/// the ratio of their throughput.
pub async fn compare_tls(dir: &Path, args: &ProduceArgs) -> anyhow::Result<()> {
    let mut totals = [(0u64, 0f64); 2];
    for round in 0..TLS_ROUNDS {
        for (slot, tls) in [(0, false), (1, true)] {
            let run_args = ProduceArgs {
                tls,
                ..args.clone()
            };
            let p = run(dir, &run_args).await?;
            let secs = p.elapsed.as_secs_f64();
            println!(
                "tls  round {} {:>9}: {:.0} records/s, {:.1} MiB/s, p99 {:.2} ms",
                round + 1,
                if tls { "mTLS" } else { "plaintext" },
                p.records as f64 / secs,
                p.bytes as f64 / (1 << 20) as f64 / secs,
                p.latency_us.value_at_quantile(0.99) as f64 / 1000.0
            );
            totals[slot].0 += p.records;
            totals[slot].1 += secs;
        }
    }
    let rate = |(records, secs): (u64, f64)| records as f64 / secs;
    let (plain, tls) = (rate(totals[0]), rate(totals[1]));
    println!(
        "tls  {} B records, {} per batch, {} connections x {} in flight, acks=all, fsync before ack",
        args.record_bytes, args.batch_records, args.connections, args.in_flight
    );
    println!(
        "tls  mutual TLS / plaintext throughput: {:.2} ({tls:.0} / {plain:.0} records/s over {TLS_ROUNDS} rounds each)",
        tls / plain
    );
    Ok(())
}
