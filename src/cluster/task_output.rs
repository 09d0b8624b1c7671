//! What the local launcher hears from its tasks: each line of their output is a log line, a
//! progress event of the chief, or whom a task blames as it exits, read as data; and the
//! launcher's reading of them, bounded in time so it always gets back to signals and exits.

use super::{Blame, TaskId};
use crate::progress::{EVENT_MARK, Event};
use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Starts the line in which a launched task that found the job broken says whom it blames
/// (on stdout, as it exits): `<mark>hung worker:1` or `<mark>died worker:1`.
const BLAME_MARK: &str = "\u{1e}blame ";

/// The line a launched task prints for [`Blame`]; the launcher reads it as data.
pub fn blame_line(blame: Blame) -> String {
    match blame {
        Blame::Hung(t) => format!("{BLAME_MARK}hung {t}"),
        Blame::Died(t) => format!("{BLAME_MARK}died {t}"),
    }
}

fn parse_blame(text: &str) -> Option<Blame> {
    let (how, task) = text.split_once(' ')?;
    let task = task.parse().ok()?;
    match how {
        "hung" => Some(Blame::Hung(task)),
        "died" => Some(Blame::Died(task)),
        _ => None,
    }
}

/// One line of a task's output, as the launcher reads it.
pub(super) enum Line {
    Log(TaskId, String),
    Event(Event),
    /// Whom a task blames (see [`blame_line`]).
    Blame(TaskId, Blame),
}

/// Reads `stream` of `task` on a thread of its own, sending each line to `out`.
pub(super) fn forward(task: TaskId, stream: impl Read + Send + 'static, events: bool, out: mpsc::Sender<Line>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if let Some(blame) = line.strip_prefix(BLAME_MARK).and_then(parse_blame) {
                if out.send(Line::Blame(task, blame)).is_err() {
                    return;
                }
                continue;
            }
            let msg = match line.strip_prefix(EVENT_MARK) {
                Some(json) if events => match serde_json::from_str(json) {
                    Ok(e) => Line::Event(e),
                    Err(_) => continue,
                },
                _ => Line::Log(task, line),
            };
            if out.send(msg).is_err() {
                return;
            }
        }
    });
}

/// How long the launcher reads its tasks' output before it looks at signals and exits again.
const POLL: Duration = Duration::from_millis(20);

/// The lines that arrive within [`POLL`]. Bounded by time, not by a pause in the output: tasks
/// that print a line every few milliseconds (fast steps) kept the launcher from ever seeing
/// a SIGTERM, which then reached no task and the job ran to its end.
pub(super) fn arriving(rx: &mpsc::Receiver<Line>) -> impl Iterator<Item = Line> + '_ {
    let until = Instant::now() + POLL;
    std::iter::from_fn(move || {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        match rx.recv_timeout(left) {
            Ok(line) => Some(line),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Every task's output has closed; their exits are what is left to see.
                std::thread::sleep(left);
                None
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TaskId {
        s.parse().unwrap()
    }

    #[test]
    fn a_blame_line_reads_back_as_the_same_blame() {
        for blame in [Blame::Hung(t("worker:1")), Blame::Died(t("chief:0"))] {
            let line = blame_line(blame);
            assert_eq!(line.strip_prefix(BLAME_MARK).and_then(parse_blame), Some(blame), "{line}");
        }
        for junk in ["hung", "hung worker", "slept worker:1", "hung worker:x"] {
            assert_eq!(parse_blame(junk), None, "{junk}");
        }
    }
}
