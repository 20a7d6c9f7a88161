//! `--metrics-port PORT`: the transfer metrics of both connectors
//! (`descriptor_core::metrics`) as a Prometheus text endpoint,
//! `GET http://127.0.0.1:PORT/metrics`, served by one thread with the
//! standard library's `TcpListener` (a scrape is one short request: no HTTP
//! crate is needed). It listens on the loopback address only: exposing it
//! further is a deployment's choice (a reverse proxy, an agent that scrapes
//! locally). Port 0 picks a free port, printed at the start, so that several
//! processes on one host can each export.
//!
//! At the end of a run the demo scrapes its own endpoint once and checks
//! what it reads against what it did.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use descriptor_core::metrics::Metrics;

/// What a scrape answers: OpenMetrics text.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long a client may take to send its request or read the answer
/// before the server moves on to the next.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts serving `metrics` on 127.0.0.1:`port` from a thread of its own,
/// which lives as long as the process; returns the address bound.
pub(crate) fn serve(metrics: Metrics, port: u16) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .map_err(|e| format!("--metrics-port {port}: cannot listen on 127.0.0.1:{port}: {e}"))?;
    let address = listener
        .local_addr()
        .map_err(|e| format!("--metrics-port {port}: {e}"))?;
    std::thread::Builder::new()
        .name("metrics-endpoint".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => {
                        if let Err(e) = answer(stream, &metrics) {
                            tracing::debug!(error = %e, "metrics endpoint: a request failed");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "metrics endpoint: accept failed"),
                }
            }
        })
        .map_err(|e| format!("--metrics-port: cannot start the endpoint's thread: {e}"))?;
    Ok(address)
}

/// Answers one request: `GET /metrics` with the text, anything else 404
/// (405 for another method on it).
fn answer(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?.take(16 << 10));
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // The headers: read to the blank line, and ignored.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", CONTENT_TYPE, metrics.encode_text()),
        (_, "/metrics") => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_owned(),
        ),
        _ => ("404 Not Found", "text/plain", "try /metrics\n".to_owned()),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

/// `GET /metrics` from `address`, as a scraper does: the body.
pub(crate) fn scrape(address: SocketAddr) -> Result<String, String> {
    let fail = |e: std::io::Error| format!("scraping http://{address}/metrics: {e}");
    let mut stream = TcpStream::connect_timeout(&address, CLIENT_TIMEOUT).map_err(fail)?;
    stream
        .set_read_timeout(Some(CLIENT_TIMEOUT))
        .map_err(fail)?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .map_err(fail)?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(fail)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("http://{address}/metrics: no HTTP response"))?;
    if !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or("");
        return Err(format!("http://{address}/metrics answered {status}"));
    }
    Ok(body.to_owned())
}

/// The sum of every sample of `name` whose labels include all of `labels`
/// (`name` with its `_total` suffix, as the text writes it).
pub(crate) fn total(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?.strip_prefix('{')?;
            labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// Scrapes `address` and checks it against the run: `expected` transfers
/// of each direction completed (at least: a warm-up may add one), none
/// failed, none left in flight; prints what it read.
pub(crate) fn check(address: SocketAddr, expected: &[(&str, usize)]) -> Result<(), String> {
    let text = scrape(address)?;
    let mut seen = Vec::new();
    for &(op, transfers) in expected {
        let of = [("op", op)];
        let completed = total(&text, "nixl_connect_transfers_completed_total", &of);
        let bytes = total(&text, "nixl_connect_transfer_completed_bytes_total", &of);
        let seconds = total(&text, "nixl_connect_transfer_duration_seconds_sum", &of);
        if completed < transfers as f64 {
            return Err(format!(
                "metrics: {completed} {op} transfers completed, but the demo made {transfers}"
            ));
        }
        seen.push(format!(
            "{completed} {} ({:.1} MiB, mean {:.1} us)",
            op.to_uppercase(),
            bytes / f64::from(1 << 20),
            seconds / completed.max(1.0) * 1e6
        ));
    }
    let failed = total(&text, "nixl_connect_transfers_failed_total", &[]);
    let in_flight = total(&text, "nixl_connect_transfers_in_flight", &[]);
    if failed != 0.0 || in_flight != 0.0 {
        return Err(format!(
            "metrics: {failed} transfers failed and {in_flight} are in flight after a clean run"
        ));
    }
    let notifications = total(&text, "nixl_connect_notifications_received_total", &[]);
    println!(
        "  metrics (scraped from http://{address}/metrics): transfers completed {}; {notifications} notifications; none failed",
        seen.join(", ")
    );
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_serves_the_text_and_nothing_else() {
        let metrics = Metrics::new();
        let address = serve(metrics, 0).unwrap();
        assert!(address.ip().is_loopback());
        let text = scrape(address).unwrap();
        assert!(text.ends_with("# EOF\n"), "{text}");
        let mut stream = TcpStream::connect(address).unwrap();
        write!(stream, "GET / HTTP/1.1\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 404"), "{response}");
    }

    #[test]
    fn totals_add_the_samples_that_match() {
        let text = "a_total{op=\"read\",target=\"peer\"} 2\n\
                    a_total{op=\"read\",target=\"file\"} 3\n\
                    a_total{op=\"write\",target=\"peer\"} 5\n\
                    ab_total{op=\"read\"} 7\n";
        assert_eq!(total(text, "a_total", &[("op", "read")]), 5.0);
        assert_eq!(total(text, "a_total", &[]), 10.0);
    }
}
