//! The report as an email (multipart/alternative: plain text first, HTML second, so clients
//! that show one part pick the richest they can) and the transports that deliver it: SMTP
//! (STARTTLS required, implicit TLS, or plain to a loopback address only; optional
//! authentication; a timeout on connect and every command) or lettre's file transport
//! (`<id>.eml` files in a directory, for demos and offline use).

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use lettre::message::header::ContentType;
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use lettre::{AsyncFileTransport, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::config::{DeadletterConfig, Security, SmtpConfig, TransportKind};
use crate::report::{render_html, render_text, Report};
use crate::schedule::Schedule;

/// Where reports go.
pub enum Mailer {
    /// lettre applies its timeout to the TCP connect only; `limit` bounds each whole
    /// exchange (a server that stops answering mid-conversation would otherwise hang us).
    Smtp {
        transport: AsyncSmtpTransport<Tokio1Executor>,
        limit: Duration,
    },
    File(AsyncFileTransport<Tokio1Executor>),
}

impl std::fmt::Debug for Mailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mailer::Smtp { .. } => "Mailer::Smtp",
            Mailer::File(_) => "Mailer::File",
        })
    }
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn smtp_transport(c: &SmtpConfig) -> anyhow::Result<AsyncSmtpTransport<Tokio1Executor>> {
    if c.host.trim().is_empty() {
        bail!("smtp.host is empty");
    }
    let tls = match c.security {
        Security::Plain => {
            if !is_loopback(&c.host) {
                bail!(
                    "smtp.security = \"plain\" sends the report (and any password) unencrypted; \
                     it is allowed only to a loopback address, not {:?}: use \"starttls\" or \"tls\"",
                    c.host
                );
            }
            Tls::None
        }
        Security::Starttls | Security::Tls => {
            let mut params = TlsParameters::builder(c.host.clone());
            if !c.ca_file.as_os_str().is_empty() {
                let pem = std::fs::read(&c.ca_file)
                    .with_context(|| format!("reading smtp.ca_file {}", c.ca_file.display()))?;
                let cert = Certificate::from_pem(&pem).map_err(|e| {
                    anyhow!(
                        "smtp.ca_file {} is not a PEM certificate: {e}",
                        c.ca_file.display()
                    )
                })?;
                params = params.add_root_certificate(cert);
            }
            let params = params
                .build()
                .map_err(|e| anyhow!("TLS settings for {}: {e}", c.host))?;
            if c.security == Security::Tls {
                Tls::Wrapper(params)
            } else {
                Tls::Required(params)
            }
        }
    };
    let mut b = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(c.host.clone())
        .port(c.port_or_default())
        .tls(tls)
        .timeout(Some(Duration::from_millis(c.timeout_ms)));
    if !c.hello_name.is_empty() {
        b = b.hello_name(ClientId::Domain(c.hello_name.clone()));
    }
    if !c.username.is_empty() {
        let password = if c.password_file.as_os_str().is_empty() {
            c.password.clone()
        } else {
            kiln_settings::read_secret_file("smtp.password_file", &c.password_file)?
        };
        b = b.credentials(Credentials::new(c.username.clone(), password));
    } else if !c.password.is_empty() || !c.password_file.as_os_str().is_empty() {
        bail!("smtp.password is set but smtp.username is empty");
    }
    Ok(b.build())
}

impl Mailer {
    /// Builds the configured transport; every setting problem is reported here, before any
    /// report is due.
    pub fn new(config: &DeadletterConfig) -> anyhow::Result<Mailer> {
        match config.transport {
            TransportKind::Smtp => Ok(Mailer::Smtp {
                transport: smtp_transport(&config.smtp)?,
                limit: Duration::from_millis(config.smtp.timeout_ms),
            }),
            TransportKind::File => {
                let dir = &config.file.dir;
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating the mail directory {}", dir.display()))?;
                Ok(Mailer::File(AsyncFileTransport::<Tokio1Executor>::new(dir)))
            }
        }
    }

    /// Connects (TLS and authentication included) and closes again: a server that is down
    /// is found before the day is claimed.
    pub async fn check(&self) -> anyhow::Result<()> {
        match self {
            Mailer::Smtp { transport, limit } => {
                match tokio::time::timeout(*limit, transport.test_connection()).await {
                    Ok(Ok(true)) => Ok(()),
                    Ok(Ok(false)) => bail!("SMTP: the server did not answer NOOP"),
                    Ok(Err(e)) => Err(anyhow!("SMTP: {e}")),
                    Err(_) => bail!("SMTP: no answer within {} ms", limit.as_millis()),
                }
            }
            Mailer::File(_) => Ok(()),
        }
    }

    /// Delivers `message`.
    pub async fn send(&self, message: &Message) -> Result<(), SendError> {
        match self {
            Mailer::Smtp { transport, limit } => {
                match tokio::time::timeout(*limit, transport.send(message.clone())).await {
                    Ok(Ok(_)) => Ok(()),
                    // A negative reply, a TLS failure or a client-side error: the server did
                    // not take the message. A broken connection mid-transaction may have
                    // happened after the server took it: unknown.
                    Ok(Err(e)) => Err(SendError {
                        not_sent: e.is_transient()
                            || e.is_permanent()
                            || e.is_tls()
                            || e.is_client(),
                        error: anyhow!("SMTP: {e}"),
                    }),
                    // Unknown too: the server may be sitting on an accepted message.
                    Err(_) => Err(SendError {
                        not_sent: false,
                        error: anyhow!("SMTP: no answer within {} ms", limit.as_millis()),
                    }),
                }
            }
            Mailer::File(t) => t
                .send(message.clone())
                .await
                .map(|_| ())
                .map_err(|e| SendError {
                    not_sent: true,
                    error: anyhow!("writing the email file: {e}"),
                }),
        }
    }
}

/// A failed send, and whether the message certainly did not go out.
#[derive(Debug)]
pub struct SendError {
    pub not_sent: bool,
    pub error: anyhow::Error,
}

/// The report's email. `now_ms` and the day make its Message-ID, which the store records.
pub fn build_message(
    config: &DeadletterConfig,
    report: &Report,
    schedule: &Schedule,
    now_ms: i64,
) -> anyhow::Result<(Message, String)> {
    let r = &config.report;
    let from: Mailbox = r
        .from
        .parse()
        .map_err(|e| anyhow!("report.from {:?} is not an email address: {e}", r.from))?;
    if r.to.is_empty() {
        bail!("report.to is empty: name at least one recipient");
    }
    let domain = from.email.domain().to_string();
    let message_id = format!(
        "<kiln-deadletter.{}.{now_ms}.{}@{domain}>",
        report.day,
        std::process::id()
    );
    let mut b = Message::builder()
        .from(from)
        .subject(report.subject(&r.subject))
        .message_id(Some(message_id.clone()));
    for to in &r.to {
        let mb: Mailbox = to
            .parse()
            .map_err(|e| anyhow!("report.to entry {to:?} is not an email address: {e}"))?;
        b = b.to(mb);
    }
    let body = MultiPart::alternative()
        .singlepart(
            SinglePart::builder()
                .header(ContentType::TEXT_PLAIN)
                .body(render_text(report, schedule)),
        )
        .singlepart(
            SinglePart::builder()
                .header(ContentType::TEXT_HTML)
                .body(render_html(report, schedule)),
        );
    let message = b
        .multipart(body)
        .map_err(|e| anyhow!("building the report email: {e}"))?;
    Ok((message, message_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_only_to_loopback_and_bad_settings_are_refused() {
        let mut c = DeadletterConfig::default();
        c.smtp.security = Security::Plain;
        for ok in ["127.0.0.1", "localhost", "::1", "[::1]"] {
            c.smtp.host = ok.into();
            assert!(Mailer::new(&c).is_ok(), "{ok}");
        }
        c.smtp.host = "mail.example.com".into();
        let err = Mailer::new(&c).expect_err("plain to a remote host");
        assert!(format!("{err:#}").contains("loopback"));
        c.smtp.host = "127.0.0.1".into();
        c.smtp.password = "x".into();
        assert!(Mailer::new(&c).is_err(), "password without username");
        c.smtp.security = Security::Starttls;
        c.smtp.password = String::new();
        c.smtp.ca_file = "/nonexistent/ca.pem".into();
        assert!(format!("{:#}", Mailer::new(&c).expect_err("ca")).contains("ca_file"));
    }

    #[test]
    fn message_is_multipart_alternative() {
        let mut c = DeadletterConfig::default();
        c.report.to = vec!["ops@example.com".into(), "Lab <lab@example.com>".into()];
        let s = Schedule::parse("08:00", "UTC").expect("schedule");
        let report = Report {
            day: "2025-01-02".into(),
            zone: "UTC".into(),
            racks: vec![],
            resolved: vec![],
            dashboard_url: String::new(),
        };
        let (m, id) = build_message(&c, &report, &s, 1).expect("message");
        let raw = String::from_utf8(m.formatted()).expect("utf-8");
        assert!(raw.contains("multipart/alternative"));
        assert!(raw.contains("text/plain") && raw.contains("text/html"));
        assert!(raw.find("text/plain") < raw.find("text/html"));
        assert!(raw.contains("Subject: Kiln dead-lettered nodes 2025-01-02: 0 new, 0 still open"));
        assert!(id.starts_with("<kiln-deadletter.2025-01-02.") && raw.contains(&id));
        c.report.to = vec!["not an address".into()];
        assert!(build_message(&c, &report, &s, 1).is_err());
        c.report.to = vec![];
        assert!(build_message(&c, &report, &s, 1).is_err());
    }
}
