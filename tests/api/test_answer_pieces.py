"""A streamed answer's pieces in memory (the embedded runtime's ``AnswerPieces``): every reader
gets every piece, and the pieces of a workflow go once its run has ended and its readers have
closed, read or not."""

from __future__ import annotations

import asyncio
import uuid

from conductor_api.runtime import AnswerPieces, PieceReader


async def _read_all(reader: PieceReader, count: int) -> list[str]:
    got: list[str] = []
    while len(got) < count:
        got += await reader.more()
    return got


async def test_two_readers_each_get_every_piece() -> None:
    pieces, workflow_id = AnswerPieces(), uuid.uuid4()
    pieces.open(workflow_id)
    early = pieces.reader(workflow_id)
    write = pieces.sink(workflow_id, 0)
    await write("six")
    late = pieces.reader(workflow_id)  # comes after the first piece: reads it too
    reads = asyncio.gather(_read_all(early, 3), _read_all(late, 3))
    await write(" times")
    await write(" seven")

    assert await reads == [["six", " times", " seven"]] * 2
    await early.close()  # one reader closing leaves the other's pieces be
    await write(" is")
    assert await late.more() == [" is"]
    await late.close()


async def test_the_pieces_go_when_the_run_ends_and_its_readers_have_closed() -> None:
    pieces = AnswerPieces()
    unread, read = uuid.uuid4(), uuid.uuid4()
    for workflow_id in (unread, read):
        pieces.open(workflow_id)
        await pieces.sink(workflow_id, 0)("forty-two")
    reader = pieces.reader(read)
    assert await pieces.writing(unread)

    # Nobody reads the first: its pieces go as its run ends
    pieces.end(unread)
    assert not await pieces.writing(unread)
    assert unread not in pieces._answers
    # The second's reader, attached when the run ended, still reads them; they go as it closes
    pieces.end(read)
    assert not await pieces.writing(read)
    assert await reader.more() == ["forty-two"]
    await reader.close()
    assert pieces._answers == {}


async def test_a_workflow_that_did_not_ask_keeps_no_pieces() -> None:
    pieces, workflow_id = AnswerPieces(), uuid.uuid4()
    await pieces.sink(workflow_id, 0)("forty-two")
    reader = pieces.reader(workflow_id)

    assert not await pieces.writing(workflow_id)
    assert await reader.more(wait=False) == []
    await reader.close()
    assert pieces._answers == {}
