//! A small per-session memo of what a route derives (its label and subject, its
//! histograms), so the hot path neither formats nor looks up a registry.

/// What a session derives from a request's route and keeps for the next one with it,
/// so that the hot path neither formats nor looks up a registry: a small list, searched
/// in order, of at most [`MAX_CACHED`] entries; past that, values are made each time.
pub(super) struct Cache<K, V>(Vec<(K, V)>);

/// Entries one session keeps in each [`Cache`].
const MAX_CACHED: usize = 16;

impl<K, V> Default for Cache<K, V> {
    fn default() -> Self {
        Cache(Vec::new())
    }
}

impl<K, V: Clone> Cache<K, V> {
    /// The value whose key `is` picks, or the one `make` makes (kept if there is room).
    pub(super) fn get(&mut self, is: impl Fn(&K) -> bool, make: impl FnOnce() -> (K, V)) -> V {
        if let Some((_, v)) = self.0.iter().find(|(k, _)| is(k)) {
            return v.clone();
        }
        let (k, v) = make();
        if self.0.len() < MAX_CACHED {
            self.0.push((k, v.clone()));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_at_most_its_limit_and_still_answers_past_it() {
        let mut cache: Cache<u32, u32> = Cache::default();
        let mut made = 0;
        let mut get = |cache: &mut Cache<u32, u32>, key: u32| {
            cache.get(
                |k| *k == key,
                || {
                    made += 1;
                    (key, key * 10)
                },
            )
        };
        for key in 0..MAX_CACHED as u32 {
            assert_eq!(get(&mut cache, key), key * 10);
        }
        // Kept: asked again, nothing is made.
        assert_eq!(get(&mut cache, 0), 0);
        let over = MAX_CACHED as u32;
        // Past the limit: answered, made each time, not kept.
        assert_eq!(get(&mut cache, over), over * 10);
        assert_eq!(get(&mut cache, over), over * 10);
        assert_eq!(cache.0.len(), MAX_CACHED);
        assert_eq!(made, MAX_CACHED + 2);
    }
}
