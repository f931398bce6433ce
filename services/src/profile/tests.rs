//! The profile service without a bus: handlers and hand-overs called directly.

use proto::Message;

use super::*;
use crate::service::keyed_request as request;

fn get(service: &mut Service, key: &str) -> Profile {
    let handled = service.call("get", request("", key, &[], GetRequest {}));
    assert_eq!(handled.response.code, code::OK, "{:?}", handled.response);
    Profile::decode(handled.response.body).unwrap()
}

fn set(service: &mut Service, uid: &str, key: &str, display: &str, color: &str) -> (u32, String) {
    let body = SetRequest {
        display: display.into(),
        color: color.into(),
    };
    let response = service.call("set", request(uid, key, &[], body)).response;
    (response.code, response.message)
}

#[test]
fn a_player_has_a_stable_default_until_it_sets_its_own() {
    let mut profiles = service();
    let ann = get(&mut profiles, "ann");
    assert_eq!(ann, default_profile("ann"));
    assert_eq!((ann.display.as_str(), ann.uid.as_str()), ("ann", "ann"));
    assert!(PALETTE.contains(&ann.color.as_str()));
    assert_eq!(get(&mut profiles, "ann"), ann, "the same colour every time");

    assert_eq!(set(&mut profiles, "ann", "ann", "Ann", "").0, code::OK);
    let named = get(&mut profiles, "ann");
    assert_eq!((named.display.as_str(), named.color), ("Ann", ann.color));
    assert_eq!(set(&mut profiles, "ann", "ann", "", "#00ff7f").0, code::OK);
    let coloured = get(&mut profiles, "ann");
    assert_eq!(
        (coloured.display.as_str(), coloured.color.as_str()),
        ("Ann", "#00ff7f")
    );
    assert_eq!(
        get(&mut profiles, "bob"),
        default_profile("bob"),
        "others untouched"
    );
}

#[test]
fn a_set_is_checked_and_only_for_the_player_itself() {
    let mut profiles = service();
    assert_eq!(
        set(&mut profiles, "", "ann", "Ann", "").0,
        code::UNAUTHORIZED
    );
    assert_eq!(
        set(&mut profiles, "bob", "ann", "Ann", "").0,
        code::FORBIDDEN
    );
    let long = "x".repeat(MAX_DISPLAY_LEN);
    assert_eq!(set(&mut profiles, "ann", "ann", &long, "").0, code::OK);
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
        let (code, message) = set(&mut profiles, "ann", "ann", display, color);
        assert_eq!(code, code::BAD_REQUEST, "{display:?} {color:?}: {message}");
    }
    assert_eq!(
        get(&mut profiles, "ann").display,
        long,
        "refusals change nothing"
    );
}

#[test]
fn past_the_limit_new_profiles_are_refused_503_and_set_ones_still_change() {
    let mut profiles = with_limit(2);
    assert_eq!(set(&mut profiles, "ann", "ann", "Ann", "").0, code::OK);
    assert_eq!(set(&mut profiles, "bob", "bob", "Bob", "").0, code::OK);
    let (code, message) = set(&mut profiles, "cat", "cat", "Cat", "");
    assert_eq!(code, code::UNAVAILABLE, "{message}");
    assert_eq!(get(&mut profiles, "cat"), default_profile("cat"));
    assert_eq!(set(&mut profiles, "ann", "ann", "Anna", "").0, code::OK);
    assert_eq!(get(&mut profiles, "ann").display, "Anna");
}

#[test]
fn a_partition_s_profiles_move_with_it_and_leave_the_old_owner() {
    let (mut old, mut new) = (service(), service());
    let uids = ["ann", "bob", "cat", "dan", "eve"];
    for uid in uids {
        assert_eq!(set(&mut old, uid, uid, &uid.to_uppercase(), "").0, code::OK);
    }
    let partition = partition_of(b"ann", PARTITIONS);
    let state = old.hand_over(partition).reply.unwrap();
    assert!(new.take_over(partition, Some(state)).ok);
    for uid in uids {
        let moved = partition_of(uid.as_bytes(), PARTITIONS) == partition;
        let display = |service: &mut Service| get(service, uid).display;
        let (on_old, on_new) = (display(&mut old), display(&mut new));
        if moved {
            assert_eq!((on_old.as_str(), on_new), (uid, uid.to_uppercase()));
        } else {
            assert_eq!((on_old, on_new.as_str()), (uid.to_uppercase(), uid));
        }
    }
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
