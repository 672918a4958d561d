//! What a simulated node does with a command line: the ones the real checks send (the
//! probe and its samples, the InfiniBand sysfs loop, `ip -j link` with the Ethernet sysfs
//! loop, `dcgmi`, gpu-burn, stress-ng, smartctl, fio) are answered from the node's recordings; `kill -KILL -- -PGID` stops a hung command; anything
//! else is "not found" (exit 127), as a shell would say.
//!
//! Agents wrap every command as `exec setsid -w sh -c '<print pgid>; exec sh -c "$1"' kiln
//! '<command>'` (kiln-checks' `ssh.rs`); [`unwrap_command`] takes the command back out of that.

use crate::node::SimNode;
use crate::spec::Fault;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Output {
        stdout: String,
        stderr: String,
        code: u32,
    },
    /// Never finishes (until killed or the channel closes).
    Hang,
    /// `kill -KILL -- -PGID`.
    Kill(u32),
}

impl Reply {
    fn ok(stdout: String) -> Reply {
        Reply::Output {
            stdout,
            stderr: String::new(),
            code: 0,
        }
    }
}

/// The command inside the agent's process-group wrapper, and whether it was wrapped (then
/// the node reports a process group id on stderr first, as `setsid` would).
pub fn unwrap_command(exec: &str) -> (String, bool) {
    let words = shell_words(exec);
    if let Some(words) = words {
        if words.len() == 8
            && words[..5] == ["exec", "setsid", "-w", "sh", "-c"]
            && words[5].contains("kiln-pgid=")
            && words[6] == "kiln"
        {
            return (words[7].clone(), true);
        }
    }
    (exec.to_string(), false)
}

/// Splits a command line into words as `sh` would for quoting ('...', "...", \x); no
/// expansion. `None` on an unclosed quote.
pub fn shell_words(s: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        x => cur.push(x),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => {
                            let x = chars.next()?;
                            if !matches!(x, '"' | '\\' | '$' | '`') {
                                cur.push('\\');
                            }
                            cur.push(x);
                        }
                        x => cur.push(x),
                    }
                }
            }
            '\\' => {
                in_word = true;
                cur.push(chars.next()?);
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    Some(words)
}

/// Answers one command on `node`; `flaky`: this run shows the node's intermittent fault.
pub fn respond(node: &SimNode, command: &str, flaky: bool) -> Reply {
    let command = command.trim();
    if let Some(rest) = command.strip_prefix("kill -KILL -- -") {
        if let Ok(pgid) = rest.trim().parse() {
            return Reply::Kill(pgid);
        }
    }
    if let Some(rest) = command.strip_prefix("for f in ") {
        return Reply::ok(sysfs_loop(node, rest));
    }
    if command.contains("smartctl") {
        return Reply::ok(node.smartctl());
    }
    let words = shell_words(command).unwrap_or_default();
    let program = words
        .first()
        .map(|w| w.rsplit('/').next().unwrap_or(w).to_string())
        .unwrap_or_default();
    let stress_hangs = node.has(&Fault::Hang);
    match program.as_str() {
        "kiln" if words.get(1).map(String::as_str) == Some("probe") => {
            let sample = words.iter().any(|w| w == "--sample");
            let (stdout, code) = if sample {
                node.probe_sample()
            } else {
                node.probe()
            };
            Reply::Output {
                stdout,
                stderr: String::new(),
                code: u32::try_from(code).unwrap_or(1),
            }
        }
        "ip" if words.iter().any(|w| w == "-j")
            && words.iter().any(|w| w.trim_end_matches(';') == "link") =>
        {
            // The Ethernet step: `ip -j link; echo; for i in IF...; do <sysfs reads>; done`.
            let interfaces = eth_loop_interfaces(&words);
            Reply::ok(format!(
                "{}\n{}",
                node.ip_link(flaky),
                node.eth_sysfs(flaky, &interfaces)
            ))
        }
        "dcgmi" if stress_hangs => Reply::Hang,
        "dcgmi" => Reply::ok(node.dcgm_json()),
        "fio" if stress_hangs => Reply::Hang,
        "fio" => Reply::ok(crate::fixtures::FIO_PASS.to_string()),
        "stress-ng" if stress_hangs => Reply::Hang,
        "stress-ng" => Reply::ok(
            "stress-ng: info:  [4242] dispatching hogs: 2 cpu, 2 vm\n\
             stress-ng: info:  [4242] successful run completed in 600.00s\n"
                .into(),
        ),
        "true" | ":" => Reply::ok(String::new()),
        "hostname" => Reply::ok(format!("{}\n", node.hostname())),
        _ if command.contains("gpu_burn") || command.contains("gpu-burn") => {
            if stress_hangs {
                Reply::Hang
            } else {
                Reply::ok(node.gpu_burn_output())
            }
        }
        _ => Reply::Output {
            stdout: String::new(),
            stderr: format!("sh: 1: {program}: not found\n"),
            code: 127,
        },
    }
}

/// The interfaces of the Ethernet step's `for i in A B C; do` loop.
fn eth_loop_interfaces(words: &[String]) -> Vec<String> {
    let Some(start) = words.iter().position(|w| w == "for") else {
        return Vec::new();
    };
    words
        .iter()
        .skip(start + 3)
        .take_while(|w| !w.ends_with(';') && *w != "do")
        .cloned()
        .chain(
            words
                .iter()
                .skip(start + 3)
                .find(|w| w.ends_with(';'))
                .map(|w| w.trim_end_matches(';').to_string()),
        )
        .filter(|w| !w.is_empty())
        .collect()
}

/// `for f in GLOB...; do [ -f "$f" ] && printf '%s\t%s\n' "$f" "$(head -n 1 "$f")"; done`:
/// the loop the InfiniBand check sends, run over the node's sysfs snapshot.
fn sysfs_loop(node: &SimNode, rest: &str) -> String {
    let globs = rest.split(';').next().unwrap_or_default();
    let mut out = String::new();
    for pattern in globs.split_whitespace() {
        for path in node.glob_sysfs(pattern) {
            if let Some(line) = node.read_sysfs(&path) {
                out.push_str(&format!("{path}\t{line}\n"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_wrapper_is_taken_off() {
        let wrapped = "exec setsid -w sh -c 'printf \"kiln-pgid=%s\\n\" \"$$\" >&2; exec sh -c \"$1\"' kiln 'echo '\\''it'\\''s'\\'' \"x\"'";
        assert_eq!(
            unwrap_command(wrapped),
            ("echo 'it's' \"x\"".to_string(), true)
        );
        assert_eq!(
            unwrap_command("ip -j link"),
            ("ip -j link".to_string(), false)
        );
        assert_eq!(
            shell_words("a 'b c' \"d\\\"e\" f\\ g"),
            Some(vec!["a".into(), "b c".into(), "d\"e".into(), "f g".into()])
        );
        assert_eq!(shell_words("'open"), None);
    }
}
