// A pomelo client on the npm pomelo-protocol codec against the real `shaddock up`:
// handshake with a dictionary, request/notify/response by string route and by code,
// pushes, kicks, heartbeats, and a pomelo client chatting with a Shaddock client.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { JsonClient, PomeloClient, connectKnowing, startShaddock, within } from './shaddock.mjs';

let shaddock;

before(async () => {
  // Pomelo counts heartbeats in seconds: 1 s keeps the timeout test short.
  shaddock = await startShaddock(['--heartbeat', '1000ms']);
});

after(async () => {
  await shaddock?.stop();
});

test('the handshake answers with heartbeat, serializer and the route dictionary', async () => {
  const client = await connectKnowing(shaddock.url, 'chat.chat.login');
  assert.equal(client.answer.code, 200);
  assert.equal(client.answer.sys.heartbeat, 1);
  assert.equal(client.answer.sys.serializer, 'json');
  for (const route of ['chat.chat.join', 'chat.chat.say', 'chat.message', 'echo.echo.echo']) {
    assert.equal(typeof client.dict[route], 'number', `${route} in ${JSON.stringify(client.dict)}`);
  }
  const codes = Object.values(client.dict);
  assert.equal(new Set(codes).size, codes.length, 'codes are unique');
  assert.ok(codes.every((c) => c >= 1 && c <= 0xffff));
  await client.close();
});

test('requests by string route and by dictionary code, notifies, errors', async () => {
  const client = await connectKnowing(shaddock.url, 'chat.chat.login');
  // An untyped route: the JSON body reaches the worker as it is, and comes back.
  assert.deepEqual(
    await client.request('echo.echoHandler.raw', { msg: 'Hello World' }),
    { msg: 'Hello World' },
  );
  // A typed route, by code and by string: the body is transcoded both ways.
  assert.deepEqual(await client.request('echo.echo.echo', { body: 'aGk=' }), { body: 'aGk=' });
  assert.deepEqual(
    await client.request('echo.echo.echo', { body: 'aGk=' }, { compress: false }),
    { body: 'aGk=' },
  );
  const login = await client.request('chat.chat.login', { name: 'pia' });
  assert.equal(login.name, 'pia');
  // Errors: {code, msg}.
  const missing = await client.request('nosuch.handler.method', {});
  assert.equal(missing.code, 404);
  const bad = await client.request('chat.chatHandler.join', { room: 5 });
  assert.equal(bad.code, 400);
  assert.match(bad.msg, /room/);
  // A notify has no answer, but it is handled: the join shows in the room. Chat
  // workers learn membership from their own state changes over the bus (docs/chat.md),
  // so a members request right behind the notify may not see it yet: ask until it does.
  client.notify('chat.chat.join', { room: 'quiet' });
  await within((async () => {
    for (;;) {
      const members = await client.request('chat.chatHandler.members', { room: 'quiet' });
      if (members.members?.includes('pia')) return;
    }
  })(), 'the notified join to show in the room');
  await client.close();
});

test('pushes reach pomelo clients, by dictionary code', async () => {
  const ann = await connectKnowing(shaddock.url, 'chat.message');
  const bob = await PomeloClient.connect(shaddock.url);
  await ann.request('chat.chat.login', { name: 'ann' });
  await bob.request('chat.chat.login', { name: 'bob' });
  await ann.request('chat.chat.join', { room: 'hall' });
  await bob.request('chat.chatHandler.join', { room: 'hall' }, { compress: false });
  await bob.request('chat.chat.say', { room: 'hall', text: 'hi ann' });
  const joined = await ann.push();
  assert.deepEqual(joined.body, { room: 'hall', name: 'bob', reason: 'joined' });
  const said = await ann.push();
  assert.equal(said.route, 'chat.message');
  assert.ok(said.compressed, 'the route came as its code');
  // The sender's display name and colour come from its profile (chat.login calls the
  // profile service): a colour of the palette, by the uid's hash.
  const { color, ...message } = said.body;
  assert.match(color, /^#[0-9a-f]{6}$/);
  assert.deepEqual(message, { room: 'hall', from: 'bob', text: 'hi ann', display: 'bob' });
  await ann.close();
  await bob.close();
});

test('a second login kicks the first with a pomelo kick', async () => {
  const first = await connectKnowing(shaddock.url, 'chat.chat.login');
  await first.request('chat.chat.login', { name: 'kit' });
  const second = await PomeloClient.connect(shaddock.url);
  await second.request('chat.chat.login', { name: 'kit' });
  const closed = await within(first.closed, 'the kicked session to close');
  assert.equal(first.kicks.length, 1);
  assert.equal(typeof first.kicks[0].reason, 'string');
  assert.deepEqual(closed, { code: 1008, reason: 'kicked' });
  await second.close();
});

test('a client that beats like pomelo stays, a silent one is closed after two intervals', async () => {
  const beating = await PomeloClient.connect(shaddock.url);
  const silent = await PomeloClient.connect(shaddock.url, { heartbeats: false });
  const start = Date.now();
  const closed = await within(silent.closed, 'the silent session to close');
  assert.deepEqual(closed, { code: 1008, reason: 'heartbeat missed' });
  assert.ok(Date.now() - start >= 1500, 'closed only after two missed intervals');
  // The beating client went through the same two intervals and is still served.
  assert.ok(beating.heartbeatsSeen >= 2, `${beating.heartbeatsSeen} heartbeats`);
  assert.deepEqual(await beating.request('echo.echoHandler.raw', [1, 2]), [1, 2]);
  await beating.close();
});

test('a pomelo client and a Shaddock client chat in one room', async () => {
  const pomelo = await connectKnowing(shaddock.url, 'chat.chat.login');
  const ours = await JsonClient.connect(shaddock.url);
  await pomelo.request('chat.chat.login', { name: 'pomelo' });
  await pomelo.request('chat.chatHandler.join', { room: 'mixed' });
  assert.equal((await ours.call('chat.login', { name: 'shaddock' })).code, 200);
  assert.equal((await ours.call('chat.join', { room: 'mixed' })).code, 200);
  assert.equal((await ours.call('chat.say', { room: 'mixed', text: 'to pomelo' })).code, 200);
  await pomelo.request('chat.chatHandler.say', { room: 'mixed', text: 'to shaddock' });

  const joined = await pomelo.push();
  assert.equal(joined.route, 'chat.joined');
  const said = await pomelo.push();
  const { color, ...mixed } = said.body;
  assert.match(color, /^#[0-9a-f]{6}$/);
  assert.deepEqual(mixed, { room: 'mixed', from: 'shaddock', text: 'to pomelo', display: 'shaddock' });
  const own = await pomelo.push();
  assert.equal(own.body.text, 'to shaddock');

  const pushes = [];
  while (!pushes.some((p) => p.body?.text === 'to shaddock')) pushes.push((await ours.next()).push);
  assert.equal(pushes.at(-1).route, 'chat.message');
  assert.equal(pushes.at(-1).body.from, 'pomelo');
  ours.close();
  await pomelo.close();
});
