"""Cutting streamed text into speakable pieces (worker/text/segments.py): where a piece ends, what
waits for the next characters, and that nothing is lost or doubled however the text is cut."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.text.markup import Delivery, drop_code_blocks, split_speech
from worker.text.segments import MAX_PIECE_CHARS, OPENING_CHARS, TextSegmenter


def pieces_of(*tokens: str, flush: bool = True, opening_chars: int = OPENING_CHARS, pauses: bool = False) -> list[str]:
    """The pieces of the text sent as `tokens` (with `pauses`: the writer pauses after each)."""
    segmenter = TextSegmenter(opening_chars=opening_chars)
    out = [p for t in tokens for p in segmenter.push(t) + (segmenter.settle() if pauses else [])]
    rest = segmenter.flush() if flush else ""
    return out + ([rest] if rest else [])


def test_a_sentence_ends_once_a_space_follows_its_period():
    segmenter = TextSegmenter()
    assert segmenter.push("It costs $3.") == []  # "50" may follow
    assert segmenter.push("50 today. And") == ["It costs $3.50 today."]
    assert segmenter.push(" then?") == []
    assert segmenter.push('" she asked') == ['And then?"']
    assert segmenter.flush() == "she asked"


def test_abbreviations_initials_and_list_numbers_do_not_end_a_sentence():
    text = "Mr. Smith met Dr. Jones at 9 a.m. sharp. J. R. R. Tolkien, e.g. the author, wrote it. Done. "
    assert pieces_of(text, flush=False, opening_chars=0) == [  # sentence ends only
        "Mr. Smith met Dr. Jones at 9 a.m. sharp.", "J. R. R. Tolkien, e.g. the author, wrote it.", "Done."]
    assert pieces_of("1. Eggs\n2. Milk\n") == ["1. Eggs", "2. Milk"]


def test_closing_marks_stay_with_their_sentence():
    assert pieces_of('He said "stop." Then (quietly.) **Bold.** Next') == [
        'He said "stop."', "Then (quietly.)", "**Bold.**", "Next"]


def test_lines_are_pieces_and_blank_lines_are_nothing():
    assert pieces_of("# Heading\n\n- item one\n- item two\n\n") == ["# Heading", "- item one", "- item two"]


def test_unspaced_languages_end_at_their_full_stop():
    segmenter = TextSegmenter()
    assert segmenter.push("今日は。明日") == ["今日は。"]
    assert segmenter.push("も晴れ！") == []  # a closing bracket may follow
    assert segmenter.push("」次") == ["明日も晴れ！」"]


def test_the_opening_pieces_of_a_turn_end_at_clauses():
    clause = "here is what I found in the documents, "  # 39 characters
    segmenter = TextSegmenter()
    assert segmenter.push("Well, the ") == []  # too short to speak alone
    assert segmenter.push("short answer to your question is this: ") == [
        "Well, the short answer to your question is this:"]
    opening = []
    while segmenter.turn_chars < OPENING_CHARS:  # the turn's opening: a piece per clause
        opening += segmenter.push(clause)
    assert opening and set(opening) == {clause.strip()}
    assert segmenter.push(clause + clause) == []  # past the opening: the sentence's end decides
    assert segmenter.push("and more. Then") == [(clause * 2).strip() + " and more."]
    assert segmenter.flush() == "Then"
    assert segmenter.push(clause) == [clause.strip()]  # a flush starts a new turn


def test_a_run_without_marks_is_cut_at_spaces_within_the_bound():
    words = ["word"] * 200
    pieces = pieces_of(" ".join(words))
    assert len(pieces) > 1 and all(len(p) <= MAX_PIECE_CHARS for p in pieces)
    assert " ".join(pieces).split() == words
    assert all(len(p) <= MAX_PIECE_CHARS for p in pieces_of("x" * 1000))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("ab .,!?\n\"')3J。") + ["Mr. ", "a.m. ", "word "]), max_size=200).map("".join),
       st.lists(st.integers(min_value=0, max_value=400), max_size=12), st.booleans())
def test_nothing_is_lost_or_doubled_however_the_text_is_cut(text, cuts, pauses):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    tokens = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    pieces = pieces_of(*tokens, pauses=pauses)
    assert all(p and p == p.strip() for p in pieces)
    assert "".join(pieces).replace(" ", "") == "".join(text.split())



@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("ab .,!?\n\"')3。") + ["Mr. ", "word ", "```\n", "```py\n", '<voice name="x">',
                                                          "</voice>", "<prosody rate=\"2\">", "</prosody>", "~~~ "]),
                max_size=120).map("".join),
       st.lists(st.integers(min_value=0, max_value=300), max_size=10), st.booleans(), st.booleans())
def test_each_piece_knows_where_its_text_stands_in_all_pushed(text, cuts, pauses, clear):
    """A live session maps the words spoken from a piece back to the text its client sent: the
    piece's own text (after any tags it reopens) is what was pushed at its offset, however the
    text was cut, with code blocks dropped, a clear between, or voice tags reopened."""
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    segmenter = TextSegmenter(max_piece_chars=40)
    pieces = []
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        pieces += segmenter.push(text[a:b]) + (segmenter.settle() if pauses else [])
        if clear and k == 1:
            segmenter.clear()
    pieces.append(segmenter.flush())
    for piece in pieces:
        own = piece[piece.reopened:]
        assert text[piece.written_at(piece.reopened):piece.written_at(len(piece))] == own, (text, piece)


def test_a_pause_ends_the_sentences_a_space_would_end():
    segmenter = TextSegmenter()
    assert segmenter.push("Sure. Let me check that for you.") == ["Sure."]
    assert segmenter.settle() == ["Let me check that for you."]  # heard during the tool call
    assert segmenter.push("The weath") == [] and segmenter.settle() == []  # an unfinished word waits
    assert segmenter.push('er is "fine."') == [] and segmenter.settle() == ['The weather is "fine."']
    assert segmenter.push("Ask Mr.") == [] and segmenter.settle() == []  # an abbreviation is no end
    assert segmenter.push(" Smith") == [] and segmenter.flush() == "Ask Mr. Smith"
    assert segmenter.push("晴れ。") == []  # a closing bracket may follow
    assert segmenter.settle() == ["晴れ。"]


def test_a_pause_inside_a_number_being_written_ends_nothing():
    # A model's tokens may stop for a moment anywhere: "$3." + pause + "50" is one price, not
    # "three dollars." then "fifty".
    segmenter = TextSegmenter()
    assert segmenter.push("It costs $3.") == [] and segmenter.settle() == []
    assert segmenter.push("50 a month.") == [] and segmenter.settle() == ["It costs $3.50 a month."]
    assert segmenter.push("The total comes to about 1,") == [] and segmenter.settle() == []  # a clause mark too
    assert segmenter.push("000 dollars, give or take") == ["The total comes to about 1,000 dollars,"]
    assert segmenter.flush() == "give or take"
    assert segmenter.push("We open at 9:") == [] and segmenter.settle() == []
    assert segmenter.push("30 sharp.") == [] and segmenter.settle() == ["We open at 9:30 sharp."]
    # A sentence that ends in a number waits for whatever comes next, and no longer than that.
    assert segmenter.push("It was built in 1990.") == [] and segmenter.settle() == []
    assert segmenter.push(" Since then") == ["It was built in 1990."]
    assert segmenter.push(" nothing changed. Is it 3?") == ["Since then nothing changed."]
    assert segmenter.settle() == ["Is it 3?"]  # no number goes on after a question mark


def test_after_a_pause_the_turns_opening_ends_at_clauses_again():
    segmenter = TextSegmenter()
    assert segmenter.push("filler " * 40 + "end. ") == ["filler " * 40 + "end."]
    assert segmenter.turn_chars >= OPENING_CHARS
    assert segmenter.push("Here is what I found in the notes, and") == []  # past the opening
    assert segmenter.settle() == []  # no sentence ended
    assert segmenter.push(" then") == ["Here is what I found in the notes,"]  # the clause ends a piece again


def test_a_code_block_is_dropped_line_by_line_as_it_comes():
    segmenter = TextSegmenter()
    reply = "Here is the fix:\n\n```python\nfor i in range(3):\n    print(i)\n```\nRun it. It prints three lines."
    pieces = [p for ch in reply for p in segmenter.push(ch)]  # one character at a time
    assert pieces + [segmenter.flush()] == ["Here is the fix:", "Run it.", "It prints three lines."]
    assert segmenter.push("Not code: ```x``` inline.\n```") == ["Not code: ```x``` inline."]
    assert segmenter.push("sh\nrm -rf /tmp/x\n") == [] and segmenter.buffer == ""  # code does not pile up
    assert segmenter.flush() == ""  # a turn's end closes its code block
    assert segmenter.push("Back to words. ") == ["Back to words."]


def test_a_fence_counts_only_at_a_lines_start_and_closes_only_with_its_own_kind():
    segmenter = TextSegmenter()
    assert segmenter.push("Type ``` then") == [] and segmenter.fence is None
    segmenter.flush()
    assert segmenter.push("~~~~\ncode\n~~~\nstill code\n```\nstill\n~~~~~\nOut. ") == ["Out."]
    assert segmenter.push("Show it:\n```") == ["Show it:"]
    assert segmenter.settle() == []  # the writer paused after the fence: "```" is not said
    assert segmenter.push("\nx = 1\n```") == [] and segmenter.settle() == [] and segmenter.fence == "```"
    assert segmenter.push("\nDone. ") == ["Done."] and segmenter.fence is None  # the closing line is complete


def test_a_long_code_line_does_not_pile_up():
    segmenter = TextSegmenter()
    segmenter.push("```\n")
    for _ in range(100):
        segmenter.push("x = 1 + 2 " * 10)  # one line of 10,000 characters, still coming
    assert len(segmenter.buffer) <= MAX_PIECE_CHARS + 100
    assert segmenter.push("\n```\nAfter it. ") == ["After it."]


def test_with_markdown_off_code_is_text():
    segmenter = TextSegmenter(reads_markup=False)
    assert segmenter.push("```sh\nls\n```\n") == ["```sh", "ls", "```"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("ab .\n`~") + ["```", "~~~", "```py\n", "\n```\n", "word. "]), max_size=120)
       .map("".join), st.lists(st.integers(min_value=0, max_value=300), max_size=10), st.booleans())
def test_the_pieces_are_the_text_that_read_markup_keeps_of_it(text, cuts, pauses):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = pieces_of(*(text[a:b] for a, b in zip(bounds, bounds[1:])), pauses=pauses)
    assert "".join(pieces).replace(" ", "") == "".join(drop_code_blocks(text).split())


def test_a_piece_inside_a_voice_element_opens_with_its_tag_again():
    segmenter = TextSegmenter()
    assert segmenter.push('Welcome back. <voice name="bm_george">Thank you. It is good') == [
        "Welcome back.", '<voice name="bm_george">Thank you.']
    assert segmenter.push(" to be here.</voice> Now, the news. ") == [
        '<voice name="bm_george">It is good to be here.</voice>', "Now, the news."]
    french = segmenter.push('<voice name="ff_siwis">Bonjour. Oui.')
    assert [split_speech(p) for p in french] == [[(Delivery("ff_siwis"), "Bonjour.")]]
    assert segmenter.flush() == '<voice name="ff_siwis">Oui.'  # a turn's end closes what it left open
    assert segmenter.push("Hello. ") == ["Hello."]
    assert segmenter.push('<prosody rate="slow">Slowly <voice name="am_adam">now. Then') == [
        '<prosody rate="slow">Slowly <voice name="am_adam">now.']
    assert segmenter.push(" on.</voice> Done.</prosody> After. ") == [
        '<prosody rate="slow"><voice name="am_adam">Then on.</voice>', '<prosody rate="slow">Done.</prosody>', "After."]
    assert TextSegmenter(reads_markup=False).push('<voice name="x">Yes. Fine. ') == ['<voice name="x">Yes.', "Fine."]
