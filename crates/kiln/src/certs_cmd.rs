//! `kiln certs`: a cluster CA and the certificates Kiln's TLS settings take (docs/security.md).
//!
//! `ca` makes the CA (`ca.crt`, `ca.key`); `broker` a broker's certificate, naming
//! `kiln-node-<id>` for the Raft transport and the Kafka listener's host names; `server` an
//! HTTPS certificate for intake or the dashboard, naming its hosts; `client` a
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
    /// Issue an HTTPS certificate for intake or the dashboard: OUT/<NAME>.crt and .key.
    Server {
        #[arg(long)]
        ca_dir: PathBuf,
        /// The service's name: its CN and the file names.
        #[arg(long)]
        name: String,
        /// Host names or IP addresses clients reach it at (repeatable, at least one).
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        #[arg(long, default_value_t = 730)]
        days: u32,
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
        bail!("name {name:?} must be letters, digits, '-', '_' or '.' (it names the files)");
    }
    Ok(name)
}

/// A certificate to issue.
struct Cert<'a> {
    common_name: &'a str,
    names: &'a [String],
    validity: Validity,
}

impl Cert<'_> {
    /// Issues it with the CA in `ca_dir` as `out/<stem>.crt` and `.key` (neither may exist);
    /// returns `out/<stem>` for the message.
    fn issue(&self, ca_dir: &Path, out: &Path, stem: &str) -> anyhow::Result<String> {
        let ca = load_ca(ca_dir)?;
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        refuse_existing(&[
            out.join(format!("{stem}.crt")),
            out.join(format!("{stem}.key")),
        ])?;
        ca.issue(self.common_name, self.names, self.validity)?
            .write(out, stem)?;
        Ok(out.join(stem).display().to_string())
    }
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
            let mut names = vec![kiln_tls::node_name(node)];
            names.extend(hosts);
            let cert = Cert {
                common_name: &kiln_tls::node_name(node),
                names: &names,
                validity: Validity {
                    days,
                    expired: false,
                },
            };
            let stem = cert.issue(&ca_dir, &out, &format!("node-{node}"))?;
            println!("wrote {stem}.crt and .key, naming {}", names.join(", "));
        }
        CertsCommand::Server {
            ca_dir,
            name,
            hosts,
            days,
            out,
        } => {
            let cert = Cert {
                common_name: &name,
                names: &hosts,
                validity: Validity {
                    days,
                    expired: false,
                },
            };
            let stem = cert.issue(&ca_dir, &out, file_name(&name)?)?;
            println!("wrote {stem}.crt and .key, naming {}", hosts.join(", "));
        }
        CertsCommand::Client {
            ca_dir,
            name,
            days,
            expired,
            out,
        } => {
            let cert = Cert {
                common_name: &name,
                names: &[],
                validity: Validity { days, expired },
            };
            let stem = cert.issue(&ca_dir, &out, file_name(&name)?)?;
            println!("wrote {stem}.crt and .key, principal User:CN={name},O=Kiln");
        }
    }
    Ok(())
}
