//! The results store over TLS to a real PostgreSQL server (the one `scripts/pg-test-server`
//! starts, with `ssl=on` and a certificate for 127.0.0.1 from its own CA):
//! `sslmode=verify-full` with that CA connects and the session is encrypted; another CA, or a
//! host name the certificate does not name, is refused with the reason, and nothing is written.

use std::str::FromStr;

use kiln_store::testing::fresh_postgres_database;
use kiln_store::{Store, StoreError};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, Row};

/// The server's CA file: `ca.crt` beside its `ssl_cert_file`.
async fn server_ca(url: &str) -> std::path::PathBuf {
    let mut conn = PgConnectOptions::from_str(url)
        .expect("URL")
        .connect()
        .await
        .expect("connect");
    let on: String = sqlx::query("SHOW ssl")
        .fetch_one(&mut conn)
        .await
        .expect("SHOW ssl")
        .get(0);
    assert_eq!(
        on, "on",
        "the test server must have ssl=on (scripts/pg-test-server turns it on)"
    );
    let cert: String = sqlx::query("SHOW ssl_cert_file")
        .fetch_one(&mut conn)
        .await
        .expect("SHOW ssl_cert_file")
        .get(0);
    let _ = conn.close().await;
    let ca = std::path::Path::new(&cert)
        .parent()
        .expect("cert dir")
        .join("ca.crt");
    assert!(ca.exists(), "{} is missing", ca.display());
    ca
}

fn with_tls(url: &str, mode: &str, ca: &std::path::Path) -> String {
    let base = url.split('?').next().expect("split yields one part");
    format!("{base}?sslmode={mode}&sslrootcert={}", ca.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_connects_with_the_servers_ca_and_refuses_anything_else() {
    let Some(url) = fresh_postgres_database().await else {
        return;
    };
    let ca = server_ca(&url).await;

    let store = Store::connect(&with_tls(&url, "verify-full", &ca))
        .await
        .expect("verify-full with the server's CA");
    let Store::Postgres(pool) = &store else {
        panic!("a postgres URL opens a PostgreSQL store")
    };
    let row = sqlx::query("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(pool)
        .await
        .expect("pg_stat_ssl");
    let (ssl, version): (bool, Option<String>) = (row.get(0), row.get(1));
    assert!(ssl, "the session is not encrypted");
    assert!(version.is_some_and(|v| v.starts_with("TLSv1.")));
    store.close().await;

    // Another CA: refused in the handshake.
    let dir = tempfile::tempdir().expect("tempdir");
    let rogue = dir.path().join("rogue");
    std::fs::create_dir(&rogue).expect("mkdir");
    kiln_tls::Ca::generate("rogue CA")
        .expect("CA")
        .write(&rogue)
        .expect("write CA");
    let refused = Store::connect(&with_tls(&url, "verify-full", &rogue.join("ca.crt"))).await;
    match refused {
        Err(StoreError::Connect { source, .. }) => {
            let why = source.to_string();
            assert!(
                why.contains("certificate") || why.contains("UnknownIssuer"),
                "{why}"
            );
        }
        Err(e) => panic!("expected a connect error, got {e}"),
        Ok(_) => panic!("a server certificate from another CA was accepted"),
    }

    // The certificate names 127.0.0.1, not localhost: verify-full refuses the name.
    let by_name = url.replacen("127.0.0.1", "localhost", 1);
    match Store::connect(&with_tls(&by_name, "verify-full", &ca)).await {
        Err(StoreError::Connect { source, .. }) => {
            assert!(
                source.to_string().contains("not valid for name"),
                "{source}"
            )
        }
        Err(e) => panic!("expected a connect error, got {e}"),
        Ok(_) => panic!("a certificate for another name was accepted"),
    }

    // A CA file that is not there is named in the error.
    let missing = dir.path().join("no-such-ca.crt");
    match Store::connect(&with_tls(&url, "verify-full", &missing)).await {
        Err(e) => assert!(
            e.to_string().contains("no-such-ca.crt") || e.to_string().contains("No such file"),
            "{e}"
        ),
        Ok(_) => panic!("a missing CA file was accepted"),
    }
}
