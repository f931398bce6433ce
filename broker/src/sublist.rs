//! The subject trie that maps a published subject to the subscriptions it reaches, and
//! the per-connection cache in front of it.
//!
//! Every insert and remove bumps a generation counter. A connection caches match results
//! tagged with the generation they were computed at, so the common case — publishing to
//! a subject whose subscribers have not changed — costs one hash lookup and one atomic
//! load, with no lock. The trie is generic over the subscription type so it can be
//! benchmarked and tested on its own; entries are identified by `Arc` pointer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use memchr::memchr;
use rustc_hash::FxHashMap;

/// Subscriptions a subject reaches: every plain one, and per queue group its members
/// (one of which gets each message).
#[derive(Debug)]
pub struct Match<T> {
    pub psubs: Vec<Arc<T>>,
    pub qsubs: Vec<(Bytes, Vec<Arc<T>>)>,
}

impl<T> Default for Match<T> {
    fn default() -> Self {
        Match {
            psubs: Vec::new(),
            qsubs: Vec::new(),
        }
    }
}

impl<T> Match<T> {
    pub fn is_empty(&self) -> bool {
        self.psubs.is_empty() && self.qsubs.is_empty()
    }

    /// Plain subscriptions plus queue groups: the copies one message turns into.
    pub fn fanout(&self) -> usize {
        self.psubs.len() + self.qsubs.len()
    }
}

struct Level<T> {
    literal: FxHashMap<Box<[u8]>, Node<T>>,
    pwc: Option<Box<Node<T>>>,
    fwc: Option<Box<Node<T>>>,
}

impl<T> Default for Level<T> {
    fn default() -> Self {
        Level {
            literal: FxHashMap::default(),
            pwc: None,
            fwc: None,
        }
    }
}

impl<T> Level<T> {
    fn is_empty(&self) -> bool {
        self.literal.is_empty() && self.pwc.is_none() && self.fwc.is_none()
    }
}

struct Node<T> {
    next: Option<Box<Level<T>>>,
    psubs: Vec<Arc<T>>,
    qsubs: Vec<(Bytes, Vec<Arc<T>>)>,
}

impl<T> Default for Node<T> {
    fn default() -> Self {
        Node {
            next: None,
            psubs: Vec::new(),
            qsubs: Vec::new(),
        }
    }
}

impl<T> Node<T> {
    fn is_empty(&self) -> bool {
        self.psubs.is_empty()
            && self.qsubs.is_empty()
            && self.next.as_ref().is_none_or(|l| l.is_empty())
    }

    fn collect(&self, out: &mut Match<T>) {
        out.psubs.extend(self.psubs.iter().cloned());
        for (queue, members) in &self.qsubs {
            // A group subscribed on several matching subjects is still one group.
            match out.qsubs.iter_mut().find(|(q, _)| q == queue) {
                Some((_, all)) => all.extend(members.iter().cloned()),
                None => out.qsubs.push((queue.clone(), members.clone())),
            }
        }
    }
}

/// The trie itself. Not synchronised; see [`SubjectIndex`].
pub struct Sublist<T> {
    root: Level<T>,
    count: usize,
}

impl<T> Default for Sublist<T> {
    fn default() -> Self {
        Sublist {
            root: Level::default(),
            count: 0,
        }
    }
}

impl<T> Sublist<T> {
    /// Subscriptions held.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Adds `sub` on a (valid) `subject`, in `queue` if given.
    pub fn insert(&mut self, subject: &[u8], queue: Option<&Bytes>, sub: Arc<T>) {
        let mut level = &mut self.root;
        let mut tokens = subject.split(|&b| b == b'.').peekable();
        let node = loop {
            let Some(token) = tokens.next() else {
                return;
            };
            let node: &mut Node<T> = match token {
                b"*" => level.pwc.get_or_insert_with(Box::default),
                b">" => level.fwc.get_or_insert_with(Box::default),
                _ => level.literal.entry(token.into()).or_default(),
            };
            if tokens.peek().is_none() {
                break node;
            }
            level = node.next.get_or_insert_with(Box::default);
        };
        match queue {
            None => node.psubs.push(sub),
            Some(queue) => match node.qsubs.iter_mut().find(|(q, _)| q == queue) {
                Some((_, members)) => members.push(sub),
                None => node.qsubs.push((queue.clone(), vec![sub])),
            },
        }
        self.count += 1;
    }

    /// Removes `sub` (by identity); returns whether it was there. Empty nodes are pruned
    /// so a churn of short-lived subjects (inboxes, players) does not grow the trie.
    pub fn remove(&mut self, subject: &[u8], queue: Option<&Bytes>, sub: &Arc<T>) -> bool {
        let removed = remove_in(&mut self.root, subject, queue, sub);
        if removed {
            self.count -= 1;
        }
        removed
    }

    /// Every subscription `subject` reaches.
    pub fn matches(&self, subject: &[u8]) -> Match<T> {
        let mut out = Match::default();
        collect_level(&self.root, subject, &mut out);
        out
    }
}

fn split_token(subject: &[u8]) -> (&[u8], Option<&[u8]>) {
    match memchr(b'.', subject) {
        Some(i) => (&subject[..i], Some(&subject[i + 1..])),
        None => (subject, None),
    }
}

fn collect_level<T>(level: &Level<T>, subject: &[u8], out: &mut Match<T>) {
    let (token, rest) = split_token(subject);
    if let Some(fwc) = &level.fwc {
        fwc.collect(out);
    }
    if let Some(pwc) = &level.pwc {
        collect_node(pwc, rest, out);
    }
    if let Some(node) = level.literal.get(token) {
        collect_node(node, rest, out);
    }
}

fn collect_node<T>(node: &Node<T>, rest: Option<&[u8]>, out: &mut Match<T>) {
    match rest {
        None => node.collect(out),
        Some(rest) => {
            if let Some(next) = &node.next {
                collect_level(next, rest, out);
            }
        }
    }
}

fn remove_in<T>(level: &mut Level<T>, subject: &[u8], queue: Option<&Bytes>, sub: &Arc<T>) -> bool {
    let (token, rest) = split_token(subject);
    let slot = match token {
        b"*" => level.pwc.as_deref_mut(),
        b">" => level.fwc.as_deref_mut(),
        _ => level.literal.get_mut(token),
    };
    let Some(node) = slot else {
        return false;
    };
    let removed = match rest {
        Some(rest) => node
            .next
            .as_deref_mut()
            .is_some_and(|next| remove_in(next, rest, queue, sub)),
        None => remove_from_node(node, queue, sub),
    };
    if removed && node.is_empty() {
        match token {
            b"*" => level.pwc = None,
            b">" => level.fwc = None,
            _ => {
                level.literal.remove(token);
            }
        }
    }
    removed
}

fn remove_from_node<T>(node: &mut Node<T>, queue: Option<&Bytes>, sub: &Arc<T>) -> bool {
    let list = match queue {
        None => &mut node.psubs,
        Some(queue) => match node.qsubs.iter_mut().find(|(q, _)| q == queue) {
            Some((_, members)) => members,
            None => return false,
        },
    };
    let Some(i) = list.iter().position(|s| Arc::ptr_eq(s, sub)) else {
        return false;
    };
    list.swap_remove(i);
    node.qsubs.retain(|(_, members)| !members.is_empty());
    true
}

/// The trie behind a lock, with the generation counter that caches check.
pub struct SubjectIndex<T> {
    trie: RwLock<Sublist<T>>,
    generation: AtomicU64,
    inserts: AtomicU64,
    removes: AtomicU64,
    matches: AtomicU64,
    fanout_sum: AtomicU64,
    fanout_max: AtomicU64,
}

impl<T> Default for SubjectIndex<T> {
    fn default() -> Self {
        SubjectIndex {
            trie: RwLock::new(Sublist::default()),
            generation: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            removes: AtomicU64::new(0),
            matches: AtomicU64::new(0),
            fanout_sum: AtomicU64::new(0),
            fanout_max: AtomicU64::new(0),
        }
    }
}

/// Counters for `/subsz`.
#[derive(Debug, Clone, Copy, Default)]
pub struct IndexStats {
    pub subscriptions: usize,
    pub inserts: u64,
    pub removes: u64,
    pub matches: u64,
    /// Largest and mean number of copies (subscriptions plus queue groups) a computed
    /// match produced.
    pub max_fanout: u64,
    pub avg_fanout: f64,
}

impl<T> SubjectIndex<T> {
    pub fn insert(&self, subject: &[u8], queue: Option<&Bytes>, sub: Arc<T>) {
        let mut trie = self.trie.write().unwrap_or_else(|e| e.into_inner());
        trie.insert(subject, queue, sub);
        // Bumped while the write lock is held, so a reader that sees the old value
        // under the read lock also saw the old trie.
        self.generation.fetch_add(1, Ordering::Release);
        self.inserts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn remove(&self, subject: &[u8], queue: Option<&Bytes>, sub: &Arc<T>) -> bool {
        let mut trie = self.trie.write().unwrap_or_else(|e| e.into_inner());
        let removed = trie.remove(subject, queue, sub);
        if removed {
            self.generation.fetch_add(1, Ordering::Release);
            self.removes.fetch_add(1, Ordering::Relaxed);
        }
        removed
    }

    /// The current generation; any change to the trie changes it.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Matches `subject`, returning the result with the generation it is valid for.
    pub fn matches(&self, subject: &[u8]) -> (u64, Match<T>) {
        let trie = self.trie.read().unwrap_or_else(|e| e.into_inner());
        self.matches.fetch_add(1, Ordering::Relaxed);
        (
            self.generation.load(Ordering::Acquire),
            trie.matches(subject),
        )
    }

    pub fn stats(&self) -> IndexStats {
        let trie = self.trie.read().unwrap_or_else(|e| e.into_inner());
        let matches = self.matches.load(Ordering::Relaxed);
        IndexStats {
            subscriptions: trie.count(),
            inserts: self.inserts.load(Ordering::Relaxed),
            removes: self.removes.load(Ordering::Relaxed),
            matches,
            max_fanout: self.fanout_max.load(Ordering::Relaxed),
            avg_fanout: if matches > 0 {
                self.fanout_sum.load(Ordering::Relaxed) as f64 / matches as f64
            } else {
                0.0
            },
        }
    }
}

/// A match result and the generation it was computed at.
type CachedMatch<T> = (u64, Arc<Match<T>>);

/// Match results one connection has computed; entries from an older generation are
/// recomputed. Bounded: when full it is cleared, which is cheap and keeps a publisher
/// of endless distinct subjects (inboxes) from growing it.
pub struct MatchCache<T> {
    entries: FxHashMap<Box<[u8]>, CachedMatch<T>>,
    capacity: usize,
    pub hits: u64,
    pub misses: u64,
}

/// Subjects one connection's cache holds before it is cleared.
pub const MATCH_CACHE_CAPACITY: usize = 1024;

impl<T> MatchCache<T> {
    pub fn new(capacity: usize) -> Self {
        MatchCache {
            entries: FxHashMap::default(),
            capacity,
            hits: 0,
            misses: 0,
        }
    }

    /// Subjects cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What `subject` reaches, from the cache when it is current.
    pub fn get(&mut self, index: &SubjectIndex<T>, subject: &[u8]) -> Arc<Match<T>> {
        let generation = index.generation();
        if let Some((g, m)) = self.entries.get(subject)
            && *g == generation
        {
            self.hits += 1;
            return m.clone();
        }
        self.misses += 1;
        let (generation, m) = index.matches(subject);
        let m = Arc::new(m);
        if self.entries.len() >= self.capacity {
            self.entries.clear();
        }
        self.entries.insert(subject.into(), (generation, m.clone()));
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(m: &Match<u32>) -> Vec<u32> {
        let mut v: Vec<u32> = m.psubs.iter().map(|s| **s).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn literal_and_wildcards() {
        let mut s = Sublist::default();
        for (i, subj) in [
            "foo.bar",
            "foo.*",
            "foo.>",
            "*.bar",
            ">",
            "foo",
            "foo.bar.baz",
        ]
        .iter()
        .enumerate()
        {
            s.insert(subj.as_bytes(), None, Arc::new(i as u32));
        }
        assert_eq!(ids(&s.matches(b"foo.bar")), vec![0, 1, 2, 3, 4]);
        assert_eq!(ids(&s.matches(b"foo")), vec![4, 5]);
        assert_eq!(ids(&s.matches(b"foo.bar.baz")), vec![2, 4, 6]);
        assert_eq!(ids(&s.matches(b"x.bar")), vec![3, 4]);
        assert_eq!(ids(&s.matches(b"x")), vec![4]);
        assert_eq!(s.count(), 7);
    }

    #[test]
    fn queue_groups_merge_across_subjects() {
        let mut s = Sublist::default();
        let q = Bytes::from_static(b"workers");
        s.insert(b"svc.echo", Some(&q), Arc::new(1));
        s.insert(b"svc.*", Some(&q), Arc::new(2));
        s.insert(b"svc.*", Some(&Bytes::from_static(b"other")), Arc::new(3));
        let m = s.matches(b"svc.echo");
        assert!(m.psubs.is_empty());
        assert_eq!(m.qsubs.len(), 2);
        assert_eq!(m.qsubs.iter().find(|(n, _)| n == &q).unwrap().1.len(), 2);
    }

    #[test]
    fn remove_prunes_and_ignores_unknown() {
        let mut s = Sublist::default();
        let a = Arc::new(1);
        let b = Arc::new(2);
        s.insert(b"a.b.c", None, a.clone());
        s.insert(b"a.*.c", Some(&Bytes::from_static(b"q")), b.clone());
        assert!(!s.remove(b"a.b.c", None, &b));
        assert!(s.remove(b"a.b.c", None, &a));
        assert!(!s.remove(b"a.b.c", None, &a));
        assert!(s.remove(b"a.*.c", Some(&Bytes::from_static(b"q")), &b));
        assert_eq!(s.count(), 0);
        assert!(s.root.is_empty());
    }

    #[test]
    fn cache_sees_changes_through_the_generation() {
        let index = SubjectIndex::default();
        let mut cache = MatchCache::new(2);
        assert!(cache.get(&index, b"foo").is_empty());
        let sub = Arc::new(7);
        index.insert(b"foo", None, sub.clone());
        assert_eq!(cache.get(&index, b"foo").psubs.len(), 1);
        assert_eq!(cache.get(&index, b"foo").psubs.len(), 1);
        assert_eq!((cache.hits, cache.misses), (1, 2));
        index.remove(b"foo", None, &sub);
        assert!(cache.get(&index, b"foo").is_empty());
        cache.get(&index, b"bar");
        cache.get(&index, b"baz");
        assert!(cache.len() <= 2);
    }
}
