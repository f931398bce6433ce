//! prost's wire-format primitives, and protobuf fields written by hand with them, for
//! the two messages on the hot path (the client's `Request` packet, [`crate::frame`];
//! the gate's `RpcRequest`): building the prost structs first would copy every string
//! and byte field once more only to encode it. The bytes are prost's — fields in tag
//! order, proto3 defaults left out — and each caller's tests compare them with prost's
//! own encoding.

use bytes::{BufMut, BytesMut};
pub use prost::encoding::{
    WireType, decode_varint, encode_key, encode_varint, encoded_len_varint, key_len,
};

/// Encoded size of a string or bytes field: nothing when empty.
pub fn bytes_len(tag: u32, len: usize) -> usize {
    if len == 0 { 0 } else { message_len(tag, len) }
}

/// A string or bytes field, left out when empty.
pub fn put_bytes(buf: &mut BytesMut, tag: u32, value: &[u8]) {
    if !value.is_empty() {
        put_message(buf, tag, value);
    }
}

/// Encoded size of a message field whose body is `len` bytes.
pub fn message_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// A message field from its encoded body, written even when empty: a set message
/// field is present whatever it holds.
pub fn put_message(buf: &mut BytesMut, tag: u32, body: &[u8]) {
    put_message_header(buf, tag, body.len());
    buf.put_slice(body);
}

/// The key and length of a message field whose `len`-byte body the caller writes next.
pub fn put_message_header(buf: &mut BytesMut, tag: u32, len: usize) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

/// Encoded size of a varint field (integers, bools): nothing when zero.
pub fn varint_len(tag: u32, value: u64) -> usize {
    if value == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(value)
    }
}

/// A varint field, left out when zero.
pub fn put_varint(buf: &mut BytesMut, tag: u32, value: u64) {
    if value != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(value, buf);
    }
}
