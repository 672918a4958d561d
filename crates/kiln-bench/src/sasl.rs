//! `kiln-bench sasl`: what a SCRAM login adds to a new connection. One broker with `[tls]`
//! and `[sasl]` on loopback; connections are opened one after another, alternating TLS alone
//! (TLS handshake and ApiVersions) with TLS plus a SCRAM-SHA-512 and a SCRAM-SHA-256 login
//! (SaslHandshake and two SaslAuthenticate round trips, with the client's PBKDF2), and the
//! medians and p99s are printed with the login's share.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use kiln_broker::config::SaslSettings;
use kiln_broker::{Broker, BrokerConfig};
use kiln_client::{Connection, SaslLogin, Security};

#[derive(Args, Debug, Clone)]
pub struct SaslArgs {
    /// Connections of each kind.
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
}

const PASSWORD: &str = "kiln-bench-password";

pub async fn run(dir: &Path, args: &SaslArgs) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir_in(dir)?;
    let (tls_settings, tls) = crate::produce::listener_tls(tmp.path(), false)?;
    let password_file = tmp.path().join("admin.password");
    std::fs::write(&password_file, PASSWORD)?;
    let config = BrokerConfig {
        listen: "127.0.0.1:0".parse()?,
        data_dir: tmp.path().join("broker"),
        tls: Some(tls_settings),
        sasl: Some(SaslSettings {
            mechanisms: vec!["SCRAM-SHA-512".into(), "SCRAM-SHA-256".into()],
            bootstrap_user: Some("bench".into()),
            bootstrap_password_file: Some(password_file),
            ..SaslSettings::default()
        }),
        ..BrokerConfig::default()
    };
    let bound = Broker::bind(config).await?;
    let address = bound.local_addr()?.to_string();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(bound.run(async {
        let _ = stop_rx.await;
    }));

    let login = |mechanism: &str| Security {
        tls: Some(tls.clone()),
        sasl: Some(SaslLogin {
            mechanism: mechanism.into(),
            user: "bench".into(),
            password: PASSWORD.into(),
        }),
    };
    let kinds = [
        (
            "TLS only",
            Security {
                tls: Some(tls.clone()),
                sasl: None,
            },
        ),
        ("TLS + SCRAM-SHA-512", login("SCRAM-SHA-512")),
        ("TLS + SCRAM-SHA-256", login("SCRAM-SHA-256")),
    ];
    let timeout = Duration::from_secs(10);
    // The bootstrap user is written through the metadata log a moment after start.
    let deadline = Instant::now() + Duration::from_secs(20);
    while Connection::open(&address, timeout, &kinds[1].1)
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            anyhow::bail!("the bootstrap user could not log in within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut histograms: Vec<Histogram<u64>> = kinds
        .iter()
        .map(|_| Histogram::new(3))
        .collect::<Result<_, _>>()?;
    for _ in 0..args.connections {
        for (i, (name, security)) in kinds.iter().enumerate() {
            let started = Instant::now();
            let conn = Connection::open(&address, timeout, security)
                .await
                .with_context(|| format!("{name} connection"))?;
            histograms[i].record(started.elapsed().as_micros() as u64)?;
            drop(conn);
        }
    }
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let base = ms(&histograms[0], 0.5);
    for ((name, _), h) in kinds.iter().zip(&histograms) {
        println!(
            "sasl  {name:<20} median {:.2} ms, p99 {:.2} ms over {} connections",
            ms(h, 0.5),
            ms(h, 0.99),
            h.len()
        );
    }
    for ((name, _), h) in kinds.iter().zip(&histograms).skip(1) {
        println!(
            "sasl  {name}: the login adds {:.2} ms per connection (median, client PBKDF2 of {} iterations included)",
            ms(h, 0.5) - base,
            kiln_sasl::ITERATIONS_DEFAULT
        );
    }
    let _ = stop_tx.send(());
    server.await??;
    Ok(())
}
