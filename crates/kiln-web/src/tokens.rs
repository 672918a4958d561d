//! Bearer tokens: what a client of intake or the dashboard presents, and the file of their
//! hashes.
//!
//! A token is `kiln_` and 64 hex digits: 32 bytes from the system's random generator. Only
//! its SHA-256 is stored. A fast hash is enough here, unlike for passwords: nobody chooses a
//! token, so there is no dictionary to try, and guessing one is guessing a 256-bit key.
//!
//! The token file holds one token per line; `#` starts a comment line:
//!
//! ```text
//! # name    scopes      hash
//! ci-intake write       sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//! operators read        sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
//! ```
//!
//! - name: 1 to [`NAME_BYTES_MAX`] of `A-Z a-z 0-9 . _ -`, unique in the file; it is what the
//!   logs say about a request, never the token;
//! - scopes: `read`, `write` or `read,write` (the dashboard asks for read, intake for write);
//! - hash: `sha256:` and 64 lowercase hex digits.
//!
//! A service reads the file at start (an error stops it) and again whenever the file changes,
//! looked at most once per [`RECHECK_INTERVAL`]: a revoked token stops working within a
//! second, with no restart. A file that turns unreadable or invalid refuses every token until
//! it is fixed (fail closed: the previous set may hold the token just revoked).

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use ring::digest;

/// Largest token file read, in bytes (about 60,000 tokens' lines; a typo'd path to a big file
/// is refused, not read).
pub const TOKEN_FILE_BYTES_MAX: u64 = 8 << 20;
/// Tokens one file may hold.
pub const TOKENS_MAX: usize = 10_000;
/// Longest token name, in bytes.
pub const NAME_BYTES_MAX: usize = 64;
/// How often a service looks whether its token file changed.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(1);

const TOKEN_PREFIX: &str = "kiln_";
const TOKEN_RANDOM_BYTES: usize = 32;
const HASH_PREFIX: &str = "sha256:";

/// What a token allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Read pages and lists (the dashboard).
    Read,
    /// Submit work (intake's manifests).
    Write,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Scope::Read => 1,
            Scope::Write => 2,
        }
    }
}

/// A set of scopes, as a token file line names them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    pub fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// `read`, `write` or `read,write`; the error says what is wrong.
    pub fn parse(text: &str) -> Result<Scopes, String> {
        let mut bits = 0u8;
        for part in text.split(',') {
            let scope = match part {
                "read" => Scope::Read,
                "write" => Scope::Write,
                other => return Err(format!("unknown scope {other:?}: read or write")),
            };
            if bits & scope.bit() != 0 {
                return Err(format!("scope {part} named twice"));
            }
            bits |= scope.bit();
        }
        assert!(bits != 0, "split yields at least one part");
        Ok(Scopes(bits))
    }
}

impl fmt::Display for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = [Scope::Read, Scope::Write]
            .into_iter()
            .filter(|s| self.contains(*s))
            .map(Scope::name)
            .collect();
        f.write_str(&names.join(","))
    }
}

impl fmt::Debug for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scopes({self})")
    }
}

/// One line of a token file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub scopes: Scopes,
    hash: [u8; 32],
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("token file {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("token file {path} line {line}: {field}: {reason}")]
    Line {
        path: String,
        line: usize,
        field: &'static str,
        reason: String,
    },
    #[error("token file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("token name {name:?}: {reason}")]
    Name { name: String, reason: String },
}

/// A fresh token: `kiln_` and 64 hex digits.
pub fn generate() -> Result<String, TokenError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| TokenError::File {
            path: String::new(),
            reason: "the system's random generator failed".into(),
        })?;
    Ok(format!("{TOKEN_PREFIX}{}", hex(&bytes)))
}

fn hash(token: &str) -> [u8; 32] {
    let d = digest::digest(&digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Checks a token name (see the module docs).
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty".into());
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(format!("longer than {NAME_BYTES_MAX} bytes"));
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        Some(c) => Err(format!("{c:?} is not allowed: use A-Z a-z 0-9 . _ -")),
        None => Ok(()),
    }
}

/// A token file's contents.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<Entry>,
    by_hash: HashMap<[u8; 32], usize>,
}

impl Tokens {
    /// Parses a token file's text; `path` only names it in errors.
    pub fn parse(path: &str, text: &str) -> Result<Tokens, TokenError> {
        let mut tokens = Tokens::default();
        let line_error = |line: usize, field: &'static str, reason: String| TokenError::Line {
            path: path.to_string(),
            line,
            field,
            reason,
        };
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = trimmed.split_whitespace().collect();
            let [name, scopes, hashed] = fields[..] else {
                return Err(line_error(
                    line,
                    "line",
                    format!(
                        "{} fields; expected three: name, scopes, sha256:HASH",
                        fields.len()
                    ),
                ));
            };
            validate_name(name).map_err(|r| line_error(line, "name", r))?;
            let scopes = Scopes::parse(scopes).map_err(|r| line_error(line, "scopes", r))?;
            let hash = hashed
                .strip_prefix(HASH_PREFIX)
                .and_then(unhex)
                .ok_or_else(|| {
                    // Never echo the field: a token pasted here by mistake must not reach a log.
                    line_error(
                        line,
                        "hash",
                        "expected sha256: and 64 lowercase hex digits (the file holds hashes, never tokens)".into(),
                    )
                })?;
            if tokens.entries.iter().any(|e| e.name == name) {
                return Err(line_error(line, "name", format!("{name} is named twice")));
            }
            if tokens.by_hash.contains_key(&hash) {
                return Err(line_error(
                    line,
                    "hash",
                    "the same token is listed twice".into(),
                ));
            }
            if tokens.entries.len() == TOKENS_MAX {
                return Err(TokenError::File {
                    path: path.to_string(),
                    reason: format!("more than {TOKENS_MAX} tokens"),
                });
            }
            tokens.by_hash.insert(hash, tokens.entries.len());
            tokens.entries.push(Entry {
                name: name.to_string(),
                scopes,
                hash,
            });
        }
        Ok(tokens)
    }

    /// The entry whose hash is the presented token's.
    pub fn find(&self, presented: &str) -> Option<&Entry> {
        let presented = hash(presented);
        let index = *self.by_hash.get(&presented)?;
        let entry = &self.entries[index];
        assert!(
            entry.hash == presented,
            "by_hash indexes entries by their hash"
        );
        Some(entry)
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }
}

fn read_text(path: &Path) -> Result<String, TokenError> {
    let io = |error| TokenError::Io {
        path: path.display().to_string(),
        error,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.len() > TOKEN_FILE_BYTES_MAX {
        return Err(TokenError::File {
            path: path.display().to_string(),
            reason: format!("over {TOKEN_FILE_BYTES_MAX} bytes"),
        });
    }
    std::fs::read_to_string(path).map_err(io)
}

/// Reads and parses a token file.
pub fn load(path: &Path) -> Result<Tokens, TokenError> {
    Tokens::parse(&path.display().to_string(), &read_text(path)?)
}

/// What a presented token turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found {
        name: String,
        scopes: Scopes,
    },
    Unknown,
    /// The token file is unreadable or invalid now: nothing is allowed (the why is logged).
    FileBroken,
}

/// Identifies one version of the file: a change to any of these is a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    Ok(Stamp {
        len: meta.len(),
        modified: meta.modified().ok(),
        inode: meta.ino(),
    })
}

struct Loaded {
    checked: Instant,
    stamp: Option<Stamp>,
    tokens: Option<Tokens>,
}

/// A service's token file, read again when it changes (see the module docs).
pub struct TokenFile {
    path: PathBuf,
    loaded: Mutex<Loaded>,
}

impl fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TokenFile {
    /// Reads the file; an error here should stop the service.
    pub fn open(path: &Path) -> Result<TokenFile, TokenError> {
        let stamp = stamp(path).map_err(|error| TokenError::Io {
            path: path.display().to_string(),
            error,
        })?;
        let tokens = load(path)?;
        if tokens.entries.is_empty() {
            tracing::warn!(path = %path.display(), "the token file holds no tokens: every request will be refused");
        }
        Ok(TokenFile {
            path: path.to_path_buf(),
            loaded: Mutex::new(Loaded {
                checked: Instant::now(),
                stamp: Some(stamp),
                tokens: Some(tokens),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Looks the presented token up, reading the file again first if it changed.
    pub fn lookup(&self, presented: &str) -> Lookup {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.checked.elapsed() >= RECHECK_INTERVAL {
            self.refresh(&mut loaded);
        }
        match &loaded.tokens {
            None => Lookup::FileBroken,
            Some(tokens) => match tokens.find(presented) {
                Some(e) => Lookup::Found {
                    name: e.name.clone(),
                    scopes: e.scopes,
                },
                None => Lookup::Unknown,
            },
        }
    }

    fn refresh(&self, loaded: &mut Loaded) {
        loaded.checked = Instant::now();
        let now = stamp(&self.path).ok();
        if now.is_some() && now == loaded.stamp {
            return;
        }
        loaded.stamp = now;
        match load(&self.path) {
            Ok(tokens) => {
                tracing::info!(path = %self.path.display(), tokens = tokens.entries.len(), "token file read again");
                loaded.tokens = Some(tokens);
            }
            Err(e) => {
                tracing::error!(error = %e, "refusing every token until the token file is fixed");
                loaded.tokens = None;
            }
        }
    }
}

/// Adds a token named `name` to the file (created, mode 0600, if absent) and returns it: the
/// only time it is ever shown.
pub fn add(path: &Path, name: &str, scopes: Scopes) -> Result<String, TokenError> {
    validate_name(name).map_err(|reason| TokenError::Name {
        name: name.to_string(),
        reason,
    })?;
    let text = match read_text(path) {
        Ok(text) => text,
        Err(TokenError::Io { error, .. }) if error.kind() == std::io::ErrorKind::NotFound => {
            "# Kiln bearer tokens: name, scopes, hash (kiln tokens create|list|revoke)\n".into()
        }
        Err(e) => return Err(e),
    };
    let existing = Tokens::parse(&path.display().to_string(), &text)?;
    if existing.entries.iter().any(|e| e.name == name) {
        return Err(TokenError::Name {
            name: name.to_string(),
            reason: format!("already in {}; revoke it first", path.display()),
        });
    }
    let token = generate()?;
    let mut text = text;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!(
        "{name} {scopes} {HASH_PREFIX}{}\n",
        hex(&hash(&token))
    ));
    // What was written must read back with the new token in it.
    let written = Tokens::parse(&path.display().to_string(), &text)?;
    assert!(written.find(&token).is_some_and(|e| e.name == name));
    replace(path, &text)?;
    Ok(token)
}

/// Takes the token named `name` out of the file; an error if there is none.
pub fn revoke(path: &Path, name: &str) -> Result<(), TokenError> {
    let text = read_text(path)?;
    let tokens = Tokens::parse(&path.display().to_string(), &text)?;
    if !tokens.entries.iter().any(|e| e.name == name) {
        return Err(TokenError::Name {
            name: name.to_string(),
            reason: format!("not in {}", path.display()),
        });
    }
    let kept: String = text
        .lines()
        .filter(|line| line.split_whitespace().next() != Some(name))
        .map(|line| format!("{line}\n"))
        .collect();
    let left = Tokens::parse(&path.display().to_string(), &kept)?;
    assert_eq!(left.entries.len() + 1, tokens.entries.len());
    replace(path, &kept)
}

/// Writes `text` as the file's new contents: a temporary file beside it, synced, renamed over
/// it, and the directory synced, so a crash leaves the old file or the new one, never half.
fn replace(path: &Path, text: &str) -> Result<(), TokenError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |error| TokenError::Io {
        path: path.display().to_string(),
        error,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| TokenError::File {
        path: path.display().to_string(),
        reason: "not a file name".into(),
    })?;
    let temp = dir.join(format!(".{}.new", file_name.to_string_lossy()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&temp, path).map_err(io)?;
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_token_added_is_found_with_its_scopes_and_revoked_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let ci = add(&path, "ci", Scopes::parse("write").unwrap()).unwrap();
        let ops = add(&path, "ops", Scopes::parse("read,write").unwrap()).unwrap();
        assert!(ci.starts_with("kiln_") && ci.len() == 5 + 64);
        assert_ne!(ci, ops);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&ci[5..]), "the file holds hashes only");
        let tokens = load(&path).unwrap();
        let e = tokens.find(&ci).unwrap();
        assert_eq!(e.name, "ci");
        assert!(e.scopes.contains(Scope::Write) && !e.scopes.contains(Scope::Read));
        assert_eq!(tokens.find(&ops).unwrap().scopes.to_string(), "read,write");
        assert!(tokens.find("kiln_0000").is_none());
        assert!(matches!(
            add(&path, "ci", Scopes::parse("read").unwrap()),
            Err(TokenError::Name { .. })
        ));
        revoke(&path, "ci").unwrap();
        let tokens = load(&path).unwrap();
        assert!(tokens.find(&ci).is_none());
        assert!(tokens.find(&ops).is_some());
        assert!(matches!(revoke(&path, "ci"), Err(TokenError::Name { .. })));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_bad_line_is_named_with_its_field_and_never_echoed() {
        let good = format!("sha256:{}", "a".repeat(64));
        let cases = [
            ("ci write", "line"),
            (&format!("c!i write {good}") as &str, "name"),
            (&format!("ci admin {good}"), "scopes"),
            (&format!("ci read,read {good}"), "scopes"),
            ("ci write kiln_secretsecret", "hash"),
            (&format!("ci write sha256:{}", "A".repeat(64)), "hash"),
        ];
        for (line, field) in cases {
            let text = format!("# comment\n\n{line}\n");
            match Tokens::parse("t", &text) {
                Err(TokenError::Line {
                    line: 3,
                    field: f,
                    reason,
                    ..
                }) => {
                    assert_eq!(f, field, "{line}");
                    assert!(!reason.contains("secret"), "{reason}");
                }
                other => panic!("{line}: {other:?}"),
            }
        }
        let twice = format!("a read {good}\nb read {good}\n");
        assert!(matches!(
            Tokens::parse("t", &twice),
            Err(TokenError::Line {
                line: 2,
                field: "hash",
                ..
            })
        ));
        let same_name = format!("a read {good}\na read sha256:{}\n", "b".repeat(64));
        assert!(matches!(
            Tokens::parse("t", &same_name),
            Err(TokenError::Line {
                line: 2,
                field: "name",
                ..
            })
        ));
    }

    #[test]
    fn a_changed_file_is_read_again_and_a_broken_one_refuses_everything() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let a = add(&path, "a", Scopes::parse("read").unwrap()).unwrap();
        let file = TokenFile::open(&path).unwrap();
        assert!(matches!(file.lookup(&a), Lookup::Found { .. }));
        revoke(&path, "a").unwrap();
        let b = add(&path, "b", Scopes::parse("read").unwrap()).unwrap();
        // Within the recheck interval the old set still answers.
        std::thread::sleep(RECHECK_INTERVAL + Duration::from_millis(50));
        assert_eq!(file.lookup(&a), Lookup::Unknown);
        assert!(matches!(file.lookup(&b), Lookup::Found { .. }));
        std::fs::write(&path, "nonsense\n").unwrap();
        std::thread::sleep(RECHECK_INTERVAL + Duration::from_millis(50));
        assert_eq!(file.lookup(&b), Lookup::FileBroken);
    }
}
