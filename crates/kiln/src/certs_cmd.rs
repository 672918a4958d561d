//! `kiln certs`: a cluster CA and the certificates Kiln's TLS settings take (docs/security.md).
//!
//! `ca` makes the CA (`ca.crt`, `ca.key`); `broker` a broker's certificate, naming
//! `kiln-node-<id>` for the Raft transport and the Kafka listener's host names; `client` a
//! client certificate whose principal is `User:CN=<name>,O=Kiln`. Keys are written readable by
//! their owner only; nothing is overwritten.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kiln_tls::{Ca, Validity};

#[derive(Debug, Args)]
pub struct CertsArgs {
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Debug, Subcommand)]
enum CertsCommand {
    /// Make a certificate authority: DIR/ca.crt (give it to every party) and DIR/ca.key (keep it offline).
    Ca {
        /// Directory to write into (created if missing).
        #[arg(long)]
        dir: PathBuf,
        /// The CA's name (its certificate's CN).
        #[arg(long, default_value = "Kiln cluster CA")]
        name: String,
    },
    /// Issue a broker's certificate: OUT/node-<ID>.crt and .key.
    Broker {
        /// Directory holding ca.crt and ca.key.
        #[arg(long)]
        ca_dir: PathBuf,
        /// The broker's node id (its certificate names kiln-node-<ID>).
        #[arg(long)]
        node: u64,
        /// Host names or IP addresses clients reach its Kafka listener at (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 730)]
        days: u32,
        /// Directory to write into.
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue a client certificate: OUT/<NAME>.crt and .key, principal User:CN=<NAME>,O=Kiln.
    Client {
        #[arg(long)]
        ca_dir: PathBuf,
        /// The client's name: its CN and the file names.
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 730)]
        days: u32,
        /// Issue it already expired (to check that a listener refuses expired certificates).
        #[arg(long)]
        expired: bool,
        #[arg(long)]
        out: PathBuf,
    },
}

fn refuse_existing(paths: &[PathBuf]) -> anyhow::Result<()> {
    for path in paths {
        if path.exists() {
            bail!(
                "{} exists; not overwriting it (remove it first to issue anew)",
                path.display()
            );
        }
    }
    Ok(())
}

fn load_ca(dir: &Path) -> anyhow::Result<Ca> {
    Ca::load(&dir.join("ca.crt"), &dir.join("ca.key"))
        .with_context(|| format!("loading the CA from {}", dir.display()))
}

fn file_name(name: &str) -> anyhow::Result<&str> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with('.');
    if !ok {
        bail!("client name {name:?} must be letters, digits, '-', '_' or '.' (it names the files)");
    }
    Ok(name)
}

pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    match args.command {
        CertsCommand::Ca { dir, name } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            refuse_existing(&[dir.join("ca.crt"), dir.join("ca.key")])?;
            Ca::generate(&name)?.write(&dir)?;
            println!(
                "wrote {} and {}",
                dir.join("ca.crt").display(),
                dir.join("ca.key").display()
            );
        }
        CertsCommand::Broker {
            ca_dir,
            node,
            hosts,
            days,
            out,
        } => {
            let ca = load_ca(&ca_dir)?;
            let stem = format!("node-{node}");
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            refuse_existing(&[
                out.join(format!("{stem}.crt")),
                out.join(format!("{stem}.key")),
            ])?;
            let mut names = vec![kiln_tls::node_name(node)];
            names.extend(hosts);
            ca.issue(
                &kiln_tls::node_name(node),
                &names,
                Validity {
                    days,
                    expired: false,
                },
            )?
            .write(&out, &stem)?;
            println!(
                "wrote {}/{stem}.crt and .key, naming {}",
                out.display(),
                names.join(", ")
            );
        }
        CertsCommand::Client {
            ca_dir,
            name,
            days,
            expired,
            out,
        } => {
            let stem = file_name(&name)?.to_string();
            let ca = load_ca(&ca_dir)?;
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            refuse_existing(&[
                out.join(format!("{stem}.crt")),
                out.join(format!("{stem}.key")),
            ])?;
            ca.issue(&name, &[], Validity { days, expired })?
                .write(&out, &stem)?;
            println!(
                "wrote {}/{stem}.crt and .key, principal User:CN={name},O=Kiln",
                out.display()
            );
        }
    }
    Ok(())
}
