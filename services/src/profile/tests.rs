//! The profile service without a bus: handlers, hand-overs and the store's jobs called
//! directly, one after another, as the frame loop would run them.

use std::collections::VecDeque;

use bytes::Bytes;
use proto::Message;
use proto::keyed::partition_of;
use proto::profile::{GetRequest, Profile, SetRequest};
use proto::rpc::RpcRequest;

use super::held::store_key;
use super::*;
use crate::context::{Answer, Later};
use crate::service::{keyed_request as request, resume};

/// Runs the store jobs and continuations `later` holds until none are left; returns
/// the answers to deferred requests.
async fn settle(later: Later) -> Vec<Answer> {
    let mut answers = later.answers;
    let mut calls: VecDeque<_> = later.calls.into();
    while let Some(call) = calls.pop_front() {
        let job = call
            .job
            .expect("the profile service makes store jobs, not calls");
        let result = job().await;
        let handled = resume(
            NAME,
            call.then,
            call.session,
            call.deadline,
            call.stem,
            result,
        );
        answers.extend(handled.later.answers);
        calls.extend(handled.later.calls);
    }
    answers
}

/// The answer to `request`: code, body, message.
async fn ask(service: &mut Service, method: &str, request: RpcRequest) -> (u32, Bytes, String) {
    let handled = service.call(method, request);
    let Some(deferred) = handled.later.deferred else {
        let response = handled.response;
        return (response.code, response.body, response.message);
    };
    let answers = settle(handled.later).await;
    let answer = answers
        .into_iter()
        .find(|answer| answer.deferred == deferred)
        .expect("a deferred request is answered");
    match answer.result {
        Ok(body) => (code::OK, body, String::new()),
        Err(error) => (error.code(), Bytes::new(), error.message().to_owned()),
    }
}

async fn get(service: &mut Service, key: &str) -> Profile {
    let (code, body, message) = ask(service, "get", request("", key, &[], GetRequest {})).await;
    assert_eq!(code, code::OK, "{message}");
    Profile::decode(body).unwrap()
}

fn set_request(uid: &str, key: &str, display: &str, color: &str) -> RpcRequest {
    let body = SetRequest {
        display: display.into(),
        color: color.into(),
    };
    request(uid, key, &[], body)
}

async fn set(
    service: &mut Service,
    uid: &str,
    key: &str,
    display: &str,
    color: &str,
) -> (u32, String) {
    let (code, _, message) = ask(service, "set", set_request(uid, key, display, color)).await;
    (code, message)
}

#[tokio::test]
async fn a_player_has_a_stable_default_until_it_sets_its_own() {
    let mut profiles = service(Store::memory());
    let ann = get(&mut profiles, "ann").await;
    assert_eq!(ann, default_profile("ann"));
    assert_eq!((ann.display.as_str(), ann.uid.as_str()), ("ann", "ann"));
    assert!(PALETTE.contains(&ann.color.as_str()));
    assert_eq!(
        get(&mut profiles, "ann").await,
        ann,
        "the same colour every time"
    );

    assert_eq!(
        set(&mut profiles, "ann", "ann", "Ann", "").await.0,
        code::OK
    );
    let named = get(&mut profiles, "ann").await;
    assert_eq!((named.display.as_str(), named.color), ("Ann", ann.color));
    assert_eq!(
        set(&mut profiles, "ann", "ann", "", "#00ff7f").await.0,
        code::OK
    );
    let coloured = get(&mut profiles, "ann").await;
    assert_eq!(
        (coloured.display.as_str(), coloured.color.as_str()),
        ("Ann", "#00ff7f")
    );
    assert_eq!(
        get(&mut profiles, "bob").await,
        default_profile("bob"),
        "others untouched"
    );
}

#[tokio::test]
async fn a_set_is_checked_and_only_for_the_player_itself() {
    let mut profiles = service(Store::memory());
    assert_eq!(
        set(&mut profiles, "", "ann", "Ann", "").await.0,
        code::UNAUTHORIZED
    );
    assert_eq!(
        set(&mut profiles, "bob", "ann", "Ann", "").await.0,
        code::FORBIDDEN
    );
    let long = "x".repeat(MAX_DISPLAY_LEN);
    assert_eq!(
        set(&mut profiles, "ann", "ann", &long, "").await.0,
        code::OK
    );
    let longer = "x".repeat(MAX_DISPLAY_LEN + 1);
    for (display, color) in [
        (longer.as_str(), ""),
        ("a\nb", ""),
        ("", "#00FF7F"),
        ("", "00ff7f"),
        ("", "#00ff7"),
        ("", "#00ff7fa"),
        ("", "#00gf7f"),
    ] {
        let (code, message) = set(&mut profiles, "ann", "ann", display, color).await;
        assert_eq!(code, code::BAD_REQUEST, "{display:?} {color:?}: {message}");
    }
    assert_eq!(
        get(&mut profiles, "ann").await.display,
        long,
        "refusals change nothing"
    );
}

#[tokio::test]
async fn past_the_limit_new_profiles_are_refused_503_and_set_ones_still_change() {
    let mut profiles = with_limit(Store::memory(), 2);
    assert_eq!(
        set(&mut profiles, "ann", "ann", "Ann", "").await.0,
        code::OK
    );
    assert_eq!(
        set(&mut profiles, "bob", "bob", "Bob", "").await.0,
        code::OK
    );
    let (code, message) = set(&mut profiles, "cat", "cat", "Cat", "").await;
    assert_eq!(code, code::UNAVAILABLE, "{message}");
    assert_eq!(get(&mut profiles, "cat").await, default_profile("cat"));
    assert_eq!(
        set(&mut profiles, "ann", "ann", "Anna", "").await.0,
        code::OK
    );
    assert_eq!(get(&mut profiles, "ann").await.display, "Anna");
}

#[tokio::test]
async fn a_partition_s_profiles_move_with_it_and_leave_the_old_owner() {
    // Two stores: what moves is what the hand-over carries.
    let (old_store, new_store) = (Store::memory(), Store::memory());
    let (mut old, mut new) = (service(old_store.clone()), service(new_store));
    let uids = ["ann", "bob", "cat", "dan", "eve"];
    for uid in uids {
        let display = uid.to_uppercase();
        assert_eq!(set(&mut old, uid, uid, &display, "").await.0, code::OK);
    }
    let partition = partition_of(b"ann", PARTITIONS);
    let state = old.hand_over(partition).reply.unwrap();
    let taken = new.take_over(partition, Some(state));
    assert!(taken.ok);
    settle(taken.later).await;
    // The old owner's memory let the partition go: a request for it would load it
    // from its store again, which fails here.
    old_store.fail(true);
    for uid in uids {
        let moved = partition_of(uid.as_bytes(), PARTITIONS) == partition;
        let on_new = get(&mut new, uid).await.display;
        let (on_old, _, _) = ask(&mut old, "get", request("", uid, &[], GetRequest {})).await;
        if moved {
            assert_eq!((on_old, on_new), (code::UNAVAILABLE, uid.to_uppercase()));
        } else {
            assert_eq!((on_old, on_new.as_str()), (code::OK, uid));
        }
    }
}

#[tokio::test]
async fn a_set_in_flight_at_a_hand_over_reaches_the_new_owner_as_asked() {
    let store = Store::memory();
    let (mut old, mut new) = (service(store.clone()), service(store));
    assert_eq!(set(&mut old, "ann", "ann", "Ann", "").await.0, code::OK);
    // A set asked, its write not yet run, when the partition leaves.
    let writing = old.call("set", set_request("ann", "ann", "Anna", ""));
    let partition = partition_of(b"ann", PARTITIONS);
    let state = old.hand_over(partition).reply.unwrap();
    // The new owner takes it and loads from the store before the write lands.
    let taken = new.take_over(partition, Some(state));
    settle(taken.later).await;
    let answers = settle(writing.later).await;
    assert!(answers.iter().all(|a| a.result.is_ok()), "{answers:?}");
    assert_eq!(get(&mut new, "ann").await.display, "Anna");
}

#[tokio::test]
async fn a_set_is_stored_before_its_answer_and_a_worker_taking_the_partition_loads_it() {
    let store = Store::memory();
    let mut first = service(store.clone());
    assert_eq!(
        set(&mut first, "ann", "ann", "Ann", "#00ff7f").await.0,
        code::OK
    );
    let stored = store.get(store_key("ann")).await.unwrap().expect("stored");
    let stored = Profile::decode(stored.value).unwrap();
    assert_eq!(
        (stored.display.as_str(), stored.color.as_str()),
        ("Ann", "#00ff7f")
    );

    // The first worker died: a new one takes the partition fresh, from the store.
    let mut second = service(store);
    let taken = second.take_over(partition_of(b"ann", PARTITIONS), None);
    settle(taken.later).await;
    assert_eq!(get(&mut second, "ann").await.display, "Ann");
}

#[tokio::test]
async fn a_store_that_fails_answers_503_and_memory_keeps_what_it_had() {
    let store = Store::memory();
    let mut profiles = service(store.clone());
    assert_eq!(
        set(&mut profiles, "ann", "ann", "Ann", "").await.0,
        code::OK
    );
    store.fail(true);
    let (code, message) = set(&mut profiles, "ann", "ann", "Anna", "").await;
    assert_eq!(code, code::UNAVAILABLE);
    assert!(
        message.starts_with("the profile was not stored: store unavailable"),
        "{message}"
    );
    assert_eq!(
        get(&mut profiles, "ann").await.display,
        "Ann",
        "reads come from memory"
    );
    store.fail(false);
    assert_eq!(
        set(&mut profiles, "ann", "ann", "Anna", "").await.0,
        code::OK
    );
    assert_eq!(get(&mut profiles, "ann").await.display, "Anna");
}

#[tokio::test]
async fn a_load_that_fails_answers_503_and_the_next_request_loads_again() {
    let store = Store::memory();
    let mut writer = service(store.clone());
    assert_eq!(set(&mut writer, "ann", "ann", "Ann", "").await.0, code::OK);
    let mut profiles = service(store.clone());
    store.fail(true);
    let (code, _, message) =
        ask(&mut profiles, "get", request("", "ann", &[], GetRequest {})).await;
    assert_eq!(code, code::UNAVAILABLE);
    assert!(
        message.starts_with("this player's profiles could not be loaded"),
        "{message}"
    );
    store.fail(false);
    assert_eq!(get(&mut profiles, "ann").await.display, "Ann");
}

#[tokio::test]
async fn sets_in_flight_for_one_player_build_on_each_other() {
    let mut profiles = service(Store::memory());
    assert_eq!(
        set(&mut profiles, "ann", "ann", "Ann", "").await.0,
        code::OK
    );
    // Two sets before either is stored: the second keeps the first's display.
    let named = profiles.call("set", set_request("ann", "ann", "Anna", ""));
    let coloured = profiles.call("set", set_request("ann", "ann", "", "#00ff7f"));
    let mut later = named.later;
    later.calls.extend(coloured.later.calls);
    let answers = settle(later).await;
    assert!(
        answers.iter().all(|answer| answer.result.is_ok()),
        "{answers:?}"
    );
    let both = get(&mut profiles, "ann").await;
    assert_eq!(
        (both.display.as_str(), both.color.as_str()),
        ("Anna", "#00ff7f")
    );
}

#[test]
fn store_keys_name_the_partition_and_escape_what_a_jetstream_key_does_not_take() {
    let partition = partition_of(b"ann", PARTITIONS);
    assert_eq!(store_key("ann"), format!("profile.p{partition}.ann"));
    let odd = "a.b:c";
    let partition = partition_of(odd.as_bytes(), PARTITIONS);
    assert_eq!(store_key(odd), format!("profile.p{partition}.=612e623a63"));
}

#[test]
fn the_default_colour_is_the_documented_palette_by_fnv1a() {
    // docs/chat.md, "Profiles": workers in other languages compute the same colours.
    assert_eq!(
        PALETTE,
        [
            "#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42a5b3", "#f032e6", "#7c9a00",
            "#c0392b", "#008080", "#9a6324", "#6a5acd",
        ]
    );
    for (uid, hash, color) in [
        ("ann", 0x1529_cc18, "#c0392b"),
        ("carol", 0x6708_8f12, "#4363d8"),
        ("p1", 0xa04e_d67a, "#9a6324"),
        ("player-42", 0xaf10_7e71, "#3cb44b"),
    ] {
        assert_eq!(fnv1a(uid.as_bytes()), hash, "{uid}");
        assert_eq!(default_profile(uid).color, color, "{uid}");
    }
}
