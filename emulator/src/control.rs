//! Control channel: newline-delimited JSON requests on a unix stream socket
//! (or stdin), one JSON reply line per request. The packet loop only checks
//! an atomic flag; parsing the request and applying it happen on the packet
//! loop's thread so the change takes effect at a well-defined time.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread;

pub struct Request {
    pub line: String,
    pub reply: Sender<String>,
}

pub struct Control {
    pub rx: Receiver<Request>,
    pub pending: Arc<AtomicBool>,
}

fn serve_lines<R: BufRead, W: Write>(r: R, mut w: W, tx: &Sender<Request>, pending: &AtomicBool) {
    for line in r.lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let (rtx, rrx) = channel();
        if tx.send(Request { line, reply: rtx }).is_err() {
            break;
        }
        pending.store(true, Ordering::Release);
        let Ok(reply) = rrx.recv() else { break };
        if writeln!(w, "{reply}").and_then(|_| w.flush()).is_err() {
            break;
        }
    }
}

impl Control {
    /// Listen on a unix socket path (an existing socket file is replaced).
    pub fn unix(path: &str) -> std::io::Result<Control> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let (tx, rx) = channel::<Request>();
        let pending = Arc::new(AtomicBool::new(false));
        let p2 = pending.clone();
        thread::Builder::new().name("vnb-control".into()).spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let tx = tx.clone();
                let p3 = p2.clone();
                let _ = thread::Builder::new().name("vnb-control-conn".into()).spawn(move || {
                    let Ok(w) = conn.try_clone() else { return };
                    serve_lines(BufReader::new(conn), w, &tx, &p3);
                });
            }
        })?;
        Ok(Control { rx, pending })
    }

    /// Read requests from stdin, reply on stdout.
    pub fn stdin() -> std::io::Result<Control> {
        let (tx, rx) = channel::<Request>();
        let pending = Arc::new(AtomicBool::new(false));
        let p2 = pending.clone();
        thread::Builder::new().name("vnb-control-stdin".into()).spawn(move || {
            let stdin = std::io::stdin();
            serve_lines(stdin.lock(), std::io::stdout(), &tx, &p2);
        })?;
        Ok(Control { rx, pending })
    }
}

/// Connect, send one request, read one reply (used by tests and `vnb-link ctl`).
pub fn request(path: &str, line: &str) -> std::io::Result<String> {
    let mut s = UnixStream::connect(path)?;
    writeln!(s, "{line}")?;
    let mut r = BufReader::new(s);
    let mut out = String::new();
    r.read_line(&mut out)?;
    Ok(out.trim_end().to_string())
}
