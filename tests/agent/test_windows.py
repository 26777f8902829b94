"""The flow control both ends share (deskbox_agent/windows.py), between two real h2
connections: what the sender may send next is what the receiver's reads handed back."""

from __future__ import annotations

from dataclasses import dataclass

import h2.config
import h2.connection
import h2.events
import h2.settings

from deskbox_agent.windows import InboundWindows

STREAM_WINDOW = 64 * 1024
CONNECTION_WINDOW = 256 * 1024
BUDGET = 128 * 1024
CHUNK = 16 * 1024  # the default MAX_FRAME_SIZE


@dataclass
class Stream:
    id: int
    owed: int = 0


class Pair:
    """A sender (client) and a receiver (server) with our windows on the receiver."""

    def __init__(self) -> None:
        self.sender = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.receiver = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self.receiver.local_settings = h2.settings.Settings(
            client=False,
            initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW})
        self.alive = True
        self.windows = InboundWindows(self.receiver, STREAM_WINDOW, CONNECTION_WINDOW, BUDGET,
                                      live=lambda: self.alive)
        self.sender.initiate_connection()
        self.receiver.initiate_connection()
        self.receiver.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self._exchange()

    def _exchange(self) -> list[h2.events.Event]:
        events: list[h2.events.Event] = []
        for _ in range(3):
            events += self.receiver.receive_data(self.sender.data_to_send())
            self.sender.receive_data(self.receiver.data_to_send())
        return events

    def open(self) -> Stream:
        stream_id = self.sender.get_next_available_stream_id()
        self.sender.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"),
                                             (":authority", "agent"), (":path", "/x")])
        self._exchange()
        return Stream(stream_id)

    def send(self, stream: Stream, size: int, padding: int = 0, frame: int = CHUNK,
             drop: bool = False) -> int:
        """Send up to ``size`` bytes in frames of ``frame`` as the windows allow; the
        receiver takes them in through the ledger (``drop``: as DATA of a stream it gave
        up). How many bytes were sent."""
        self.deliver()
        overhead = padding + 1 if padding else 0
        sent = 0
        while sent < size:
            room = min(self.sender.local_flow_control_window(stream.id) - overhead,
                       frame, size - sent)
            if room <= 0:
                break
            self.sender.send_data(stream.id, b"x" * room, pad_length=padding or None)
            sent += room
        for event in self._exchange():
            if isinstance(event, h2.events.DataReceived) and event.stream_id == stream.id:
                flow_len = event.flow_controlled_length or 0
                if drop:
                    self.windows.dropped(flow_len)
                else:
                    self.windows.received(stream, flow_len, len(event.data or b""))
        self.windows.release()
        self.deliver()
        return sent

    def deliver(self) -> None:
        """The receiver's WINDOW_UPDATEs reach the sender."""
        self.sender.receive_data(self.receiver.data_to_send())

    def room(self, stream: Stream) -> int:
        self.deliver()
        return self.sender.local_flow_control_window(stream.id)

    def connection_room(self) -> int:
        self.deliver()
        return self.sender.outbound_flow_control_window


def test_a_streams_window_comes_back_as_its_reader_reads() -> None:
    pair = Pair()
    stream = pair.open()
    assert pair.send(stream, 10 * STREAM_WINDOW) == STREAM_WINDOW
    assert pair.room(stream) == 0
    pair.windows.read(stream, STREAM_WINDOW // 4)
    assert pair.room(stream) == STREAM_WINDOW // 4 and stream.owed == 0


def test_a_stream_is_handed_back_in_one_update_once_half_is_used() -> None:
    pair = Pair()
    stream = pair.open()
    pair.send(stream, STREAM_WINDOW // 4)
    pair.windows.read(stream, STREAM_WINDOW // 4)  # three quarters left: kept owed
    assert pair.room(stream) == 3 * STREAM_WINDOW // 4 and stream.owed == STREAM_WINDOW // 4
    pair.send(stream, STREAM_WINDOW // 2)
    pair.windows.read(stream, STREAM_WINDOW // 2)
    assert pair.room(stream) == STREAM_WINDOW and stream.owed == 0


def test_a_stream_nobody_reads_does_not_stall_the_others() -> None:
    pair = Pair()
    unread, busy = pair.open(), pair.open()
    assert pair.send(unread, STREAM_WINDOW) == STREAM_WINDOW
    for _ in range(20):  # far more than the connection's window, read as it comes
        assert pair.send(busy, STREAM_WINDOW) == STREAM_WINDOW
        pair.windows.read(busy, STREAM_WINDOW)
    assert pair.room(unread) == 0


def test_the_connection_is_held_back_while_too_much_lies_unread() -> None:
    pair = Pair()
    for stream in [pair.open() for _ in range(6)]:
        assert pair.send(stream, STREAM_WINDOW) == STREAM_WINDOW
    # The first 128 KiB (the budget) came back as they arrived; nothing after them did.
    assert pair.connection_room() == 0
    late = pair.open()
    assert pair.send(late, 1) == 0
    pair.windows.discarded(4 * STREAM_WINDOW)  # four streams given up, unread
    assert pair.connection_room() == CONNECTION_WINDOW
    assert pair.send(late, 1) == 1


def test_padding_is_handed_back_with_the_data() -> None:
    pair = Pair()
    stream = pair.open()
    sent = pair.send(stream, 40 * 1024, padding=200, frame=1024)
    assert sent == 40 * 1024
    assert pair.room(stream) == STREAM_WINDOW - 40 * (1024 + 201)
    pair.windows.read(stream, sent)
    assert pair.room(stream) == STREAM_WINDOW and stream.owed == 0


def test_data_of_a_stream_given_up_frees_the_connection() -> None:
    pair = Pair()
    for stream in (pair.open(), pair.open()):
        assert pair.send(stream, STREAM_WINDOW, drop=True) == STREAM_WINDOW
    assert pair.connection_room() == CONNECTION_WINDOW


def test_nothing_is_handed_back_once_the_connection_is_gone() -> None:
    pair = Pair()
    stream = pair.open()
    pair.send(stream, STREAM_WINDOW)
    pair.alive = False
    pair.windows.read(stream, STREAM_WINDOW)
    pair.windows.discarded(0)
    assert pair.receiver.data_to_send() == b""
