//! The SDK client driver: each client is one task that owns its SDK handle
//! ([`sdk::Client`]) and a `FuturesUnordered` of its requests in flight. A
//! request's send time is taken when its future is first polled, just before the SDK
//! encodes and queues the frame; the SDK's connection task then writes it with the
//! other queued frames in one flush. Used for `wss://` (the lean driver speaks `ws://`
//! only) and with `--driver sdk`, to measure what the SDK costs.

use std::time::Instant;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use sdk::{Client, ErrorKind, Response, SdkError};

use super::books::Tally;
use super::generator::{CLOSE_TIMEOUT, ClientRun};
use super::schedule::RequestBody;
use super::stats::{Answer, Outcome};

/// Runs one client until its last request ended or the hard deadline passed.
pub(super) async fn drive(client: Client, run: ClientRun) -> Tally {
    let ClientRun {
        plan,
        mut pacer,
        route,
        payload,
        hard_deadline,
        mut books,
        ..
    } = run;
    let mut in_flight = FuturesUnordered::new();
    let mut next = 0u64;
    let hard = tokio::time::sleep_until(hard_deadline.into());
    tokio::pin!(hard);
    loop {
        // Checked here, not only by the `hard` branch: under overload an answer is
        // always ready and a biased select would never reach that branch.
        if (next >= plan.end && in_flight.is_empty()) || Instant::now() >= hard_deadline {
            break;
        }
        tokio::select! {
            // Due slots first: they come once per interval, so they cannot starve the
            // answers, while a stream of answers could starve them.
            biased;
            due = pacer.wait_due(&plan.schedule, next), if next < plan.end => {
                let due = due.min(plan.end);
                for slot in next..due {
                    let at = plan.schedule.at(slot);
                    in_flight.push(request(&client, &route, payload.body(slot), slot, at));
                }
                books.sent(next..due);
                next = due;
            }
            Some((slot, outcome)) = in_flight.next() => books.end(slot, outcome),
            () = &mut hard => break,
        }
    }
    let tally = books.finish();
    // The requests still in flight borrow the client: abandon them before closing.
    drop(in_flight);
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, client.close()).await;
    tally
}

/// One request, timed.
async fn request(
    client: &Client,
    route: &str,
    body: RequestBody,
    slot: u64,
    scheduled: Instant,
) -> (u64, Outcome) {
    let sent = Instant::now();
    let result = client.request(route, body).await;
    let received = Instant::now();
    let outcome = Outcome {
        scheduled,
        sent,
        received,
        answer: answer_of(result),
    };
    (slot, outcome)
}

fn answer_of(result: Result<Response, SdkError>) -> Answer {
    match result {
        Ok(r) => Answer::Response {
            code: r.code,
            timing: r.timing.map(Into::into),
            message: r.message,
        },
        Err(e) => match e.kind() {
            ErrorKind::Timeout => Answer::Timeout,
            ErrorKind::Closed { .. } => Answer::Failed("closed"),
            ErrorKind::Protocol => Answer::Failed("protocol"),
            ErrorKind::Connect => Answer::Failed("connect"),
            ErrorKind::Handshake { .. } => Answer::Failed("handshake"),
        },
    }
}
