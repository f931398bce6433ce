//! Checks for subject validation and the subscription trie, driven by fuzz input.
//!
//! Validation is compared with a byte-by-byte restatement of the rules. The trie, the
//! locked index and a match cache are driven through the same inserts and removes as a
//! plain list of subscriptions, and every match must agree with a brute-force scan of
//! that list: the trie's pruning, wildcard levels and queue-group merging are where a
//! bug would hide, and the list has none of them.

use std::sync::Arc;

use nats_wire::subject::{is_valid_publish, is_valid_subscribe};
use broker::sublist::{Match, MatchCache, SubjectIndex, Sublist};
use bytes::Bytes;

/// Runs every check on one input.
pub fn check(data: &[u8]) {
    for piece in data.split(|&b| b == 0) {
        check_validity(piece);
    }
    check_trie(data);
}

fn check_validity(s: &[u8]) {
    let sub = is_valid_subscribe(s);
    let publ = is_valid_publish(s);
    assert_eq!(sub, reference_valid(s, true), "is_valid_subscribe({s:?})");
    assert_eq!(publ, reference_valid(s, false), "is_valid_publish({s:?})");
    assert!(!publ || sub, "publishable but not subscribable: {s:?}");
}

/// The subject rules restated as a scan over bytes rather than over split tokens.
fn reference_valid(s: &[u8], wildcards: bool) -> bool {
    if s.is_empty() {
        return false;
    }
    let mut start = 0;
    for i in 0..=s.len() {
        if i < s.len() && s[i] != b'.' {
            if s[i].is_ascii_whitespace() {
                return false;
            }
            continue;
        }
        match &s[start..i] {
            [] => return false,
            b"*" if !wildcards => return false,
            b">" if !wildcards || i != s.len() => return false,
            _ => {}
        }
        start = i + 1;
    }
    true
}

/// Whether a subscription on `pattern` receives a message published on `subject`,
/// by walking both token lists side by side.
fn reference_matches(pattern: &[u8], subject: &[u8]) -> bool {
    let p: Vec<&[u8]> = pattern.split(|&b| b == b'.').collect();
    let s: Vec<&[u8]> = subject.split(|&b| b == b'.').collect();
    for (i, token) in p.iter().enumerate() {
        if *token == b">" {
            return s.len() > i;
        }
        match s.get(i) {
            Some(t) if *token == b"*" || token == t => {}
            _ => return false,
        }
    }
    p.len() == s.len()
}

/// A few tokens, wildcards among them, so that random subjects collide often.
const TOKENS: [&[u8]; 8] = [b"a", b"b", b"foo", b"*", b">", b"", b"a*", b"bar"];
const QUEUES: [Option<&[u8]>; 3] = [None, Some(b"q1"), Some(b"q2")];

/// Reads fuzz bytes as small choices; runs out gracefully.
struct Choices<'a>(&'a [u8]);

impl Choices<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn subject(&mut self) -> Option<Vec<u8>> {
        let n = usize::from(self.byte()? % 4) + 1;
        let mut out = Vec::new();
        for i in 0..n {
            if i > 0 {
                out.push(b'.');
            }
            out.extend_from_slice(TOKENS[usize::from(self.byte()? % 8)]);
        }
        Some(out)
    }
}

struct Entry {
    subject: Vec<u8>,
    queue: Option<Bytes>,
    sub: Arc<u32>,
}

/// Matches in a comparable form: sorted plain ids and sorted (queue, sorted ids).
type Canon = (Vec<u32>, Vec<(Vec<u8>, Vec<u32>)>);

fn canon(m: &Match<u32>) -> Canon {
    let mut psubs: Vec<u32> = m.psubs.iter().map(|s| **s).collect();
    psubs.sort_unstable();
    let mut qsubs: Vec<(Vec<u8>, Vec<u32>)> = m
        .qsubs
        .iter()
        .map(|(q, members)| {
            assert!(!members.is_empty(), "empty queue group in a match");
            let mut ids: Vec<u32> = members.iter().map(|s| **s).collect();
            ids.sort_unstable();
            (q.to_vec(), ids)
        })
        .collect();
    qsubs.sort();
    assert!(
        qsubs.windows(2).all(|w| w[0].0 != w[1].0),
        "a queue group appears twice in one match"
    );
    (psubs, qsubs)
}

fn brute_force(entries: &[Entry], subject: &[u8]) -> Canon {
    let mut m = Match::default();
    for e in entries
        .iter()
        .filter(|e| reference_matches(&e.subject, subject))
    {
        match &e.queue {
            None => m.psubs.push(e.sub.clone()),
            Some(q) => match m.qsubs.iter_mut().find(|(n, _)| n == q) {
                Some((_, members)) => members.push(e.sub.clone()),
                None => m.qsubs.push((q.clone(), vec![e.sub.clone()])),
            },
        }
    }
    canon(&m)
}

fn check_trie(data: &[u8]) {
    let mut choices = Choices(data);
    let mut trie = Sublist::default();
    let index = SubjectIndex::default();
    let mut cache = MatchCache::new(4);
    let mut entries: Vec<Entry> = Vec::new();
    let mut next_id = 0u32;
    while let Some(op) = choices.byte() {
        match op % 4 {
            0 | 1 => {
                let Some(subject) = choices.subject() else {
                    break;
                };
                let Some(q) = choices.byte() else { break };
                // The server only inserts subjects that pass validation.
                if !is_valid_subscribe(&subject) {
                    continue;
                }
                let queue = QUEUES[usize::from(q % 3)].map(Bytes::copy_from_slice);
                let sub = Arc::new(next_id);
                next_id += 1;
                trie.insert(&subject, queue.as_ref(), sub.clone());
                index.insert(&subject, queue.as_ref(), sub.clone());
                entries.push(Entry {
                    subject,
                    queue,
                    sub,
                });
            }
            2 => {
                let Some(pick) = choices.byte() else { break };
                if entries.is_empty() || pick >= 200 {
                    // Removing what is not there must change nothing.
                    let stranger = Arc::new(u32::MAX);
                    let subject = choices.subject().unwrap_or_default();
                    assert!(!trie.remove(&subject, None, &stranger));
                    assert!(!index.remove(&subject, None, &stranger));
                    continue;
                }
                let e = entries.swap_remove(usize::from(pick) % entries.len());
                assert!(
                    trie.remove(&e.subject, e.queue.as_ref(), &e.sub),
                    "remove lost"
                );
                assert!(
                    index.remove(&e.subject, e.queue.as_ref(), &e.sub),
                    "remove lost"
                );
                assert!(
                    !trie.remove(&e.subject, e.queue.as_ref(), &e.sub),
                    "removed twice"
                );
            }
            _ => {
                // Publish subjects are only validated in pedantic mode, so any shape
                // reaches the trie.
                let Some(subject) = choices.subject() else {
                    break;
                };
                let want = brute_force(&entries, &subject);
                assert_eq!(
                    canon(&trie.matches(&subject)),
                    want,
                    "trie match {subject:?}"
                );
                assert_eq!(
                    canon(&cache.get(&index, &subject)),
                    want,
                    "cached match {subject:?}"
                );
            }
        }
        assert_eq!(trie.count(), entries.len());
    }
    // Emptying the trie must leave nothing matching.
    for e in entries.drain(..) {
        assert!(trie.remove(&e.subject, e.queue.as_ref(), &e.sub));
        assert!(index.remove(&e.subject, e.queue.as_ref(), &e.sub));
    }
    assert_eq!(trie.count(), 0);
    for subject in [&b"a"[..], b"a.b", b"foo.bar.a", b""] {
        assert!(trie.matches(subject).is_empty());
        assert!(cache.get(&index, subject).is_empty());
    }
}
