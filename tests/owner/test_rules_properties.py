"""Properties of the commit owner's rules (`feedlog.delta.managed.rules`): ratification and routing.

`decide(row, request)` is the owner's whole judgement of one staged commit (managed-commits RFC,
"Commit Protocol": version v is ratified only if v-1 is the latest and v is free) plus feedlog's
additions: a released or releasing table takes nothing new, a repeated request is recognised, and
in-commit timestamps strictly increase. Hypothesis draws rows and requests around the interesting
edges (versions near latest, ICTs near latest_ict) and checks each rule, then runs random request
sequences from several writers against a model of the owner's effects.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedlog.delta.managed.protocol import FEEDLOG_OWNER, Binding
from feedlog.delta.managed.rules import (
    ACTIVE,
    PROPOSED,
    RELEASED,
    RELEASING,
    Outcome,
    Ratify,
    RatifyRequest,
    Refuse,
    Repeat,
    Route,
    TableRow,
    decide,
    decide_register,
    make_proposal,
    route,
)
from feedlog.errors import AlreadyExists, Corruption, FeedlogError, InvalidArgument

T0 = 1_790_000_000_000
KEEPS_OWNER = Binding(FEEDLOG_OWNER)
OTHER_OWNER = Binding("someone-else")
BAD_FILE = InvalidArgument("staged commit is not newline-delimited JSON")
#: what reading a staged file can find: it keeps this owner, removes it, hands the table to another, or is bad
VERDICTS = (KEEPS_OWNER, None, OTHER_OWNER, BAD_FILE, Corruption("unreadable"))
NAMES = tuple(f"{i:020d}.00000000-0000-0000-0000-00000000000{i}.json" for i in range(4))


def table_row(state: str, latest: int, latest_ict: int, backfilled: int, batch_size: int = 1) -> TableRow:
    return TableRow(
        "table-id", "/tables/t", state, "hash", None, latest, latest_ict, backfilled, batch_size, None, None, None
    )


rows = st.builds(
    lambda state, latest, ict, behind, batch: table_row(state, latest, ict, latest - behind, batch),
    st.sampled_from([ACTIVE, RELEASING, RELEASED]),
    st.integers(0, 50),
    st.integers(T0, T0 + 10**6),
    st.integers(0, 3),
    st.integers(1, 5),
)


@st.composite
def requests(draw: st.DrawFn, row: TableRow) -> RatifyRequest:
    """A request whose version and ICT are near the row's latest (where the rules change their minds)."""
    version = row.latest + draw(st.integers(-3, 3) | st.integers(-(10**3), 10**3))
    ict = row.latest_ict + draw(st.integers(-2, 2) | st.integers(-(10**6), 10**6))
    staged = draw(st.sampled_from(NAMES))
    recorded = draw(st.sampled_from((None, *NAMES))) if version <= row.latest else None
    return RatifyRequest(version, staged, ict, draw(st.booleans()), recorded, draw(st.sampled_from(VERDICTS)))


def make_proposal_for(version: int, staged: str) -> TableRow:
    return make_proposal("table-id", "/tables/t", "hash", None, version, staged, T0, 1)


rows_and_requests = rows.flatmap(lambda r: st.tuples(st.just(r), requests(r)))


def outcome_of(row: TableRow, request: RatifyRequest) -> Outcome | FeedlogError:
    try:
        return decide(row, request)
    except FeedlogError as e:
        return e


def acceptable(request: RatifyRequest) -> bool:
    """The staged file's verdict allows the request: a commit keeps this owner, a release removes it."""
    if request.release:
        return request.checked is None
    return isinstance(request.checked, Binding) and request.checked.name == FEEDLOG_OWNER


SETTINGS = settings(max_examples=400, deadline=None)


@SETTINGS
@given(rows_and_requests)
def test_every_request_has_exactly_one_outcome(case: tuple[TableRow, RatifyRequest]) -> None:
    row, request = case
    out = outcome_of(row, request)
    kinds = [k for k in (Ratify, Repeat, Refuse, FeedlogError) if isinstance(out, k)]
    assert len(kinds) == 1, out  # and nothing else escapes: no assertion, key or type error
    assert outcome_of(row, request) == out or isinstance(out, FeedlogError)  # pure: the same answer again
    if isinstance(out, Ratify):
        assert (out.version, out.ict) == (row.latest + 1, request.ict) and request.ict > row.latest_ict
        assert row.state not in (RELEASING, RELEASED) and acceptable(request)
        assert out.state == (RELEASING if request.release else row.state)
    elif isinstance(out, Repeat):
        assert out.version == request.version <= row.latest and request.recorded == request.staged
    elif isinstance(out, Refuse):
        assert out.conflict.version == request.version and out.conflict.reason


@SETTINGS
@given(rows, st.data())
def test_the_next_version_with_a_later_ict_and_a_good_staged_file_is_accepted(row: TableRow, data: st.DataObject):
    row = replace(row, state=ACTIVE)
    release = data.draw(st.booleans())
    ict = row.latest_ict + data.draw(st.integers(1, 10**6))
    request = RatifyRequest(row.latest + 1, NAMES[0], ict, release, None, None if release else KEEPS_OWNER)
    assert decide(row, request) == Ratify(row.latest + 1, ict, RELEASING if release else ACTIVE)


@SETTINGS
@given(rows_and_requests)
def test_a_taken_version_is_a_retryable_conflict_unless_it_repeats_the_same_file(
    case: tuple[TableRow, RatifyRequest],
) -> None:
    row, request = case
    row = replace(row, state=ACTIVE if row.state == RELEASED else row.state)
    request = replace(request, version=min(request.version, row.latest))
    out = decide(row, request)
    if request.recorded == request.staged:
        assert out == Repeat(request.version)
    else:
        assert isinstance(out, Refuse) and out.conflict.retryable and out.winners  # the loser reads who won


@SETTINGS
@given(rows_and_requests, st.integers(2, 10**6))
def test_a_gap_is_a_non_retryable_conflict(case: tuple[TableRow, RatifyRequest], beyond: int) -> None:
    row, request = case
    out = decide(row, replace(request, version=row.latest + beyond, recorded=None))
    assert isinstance(out, Refuse) and not out.conflict.retryable
    assert not out.winners


@SETTINGS
@given(rows_and_requests, st.integers(0, 10**6))
def test_an_ict_that_does_not_increase_is_refused(case: tuple[TableRow, RatifyRequest], back: int) -> None:
    row, request = case
    row = replace(row, state=ACTIVE)
    checked = None if request.release else KEEPS_OWNER
    stale = replace(request, version=row.latest + 1, ict=row.latest_ict - back, recorded=None, checked=checked)
    with pytest.raises(InvalidArgument, match="inCommitTimestamp"):
        decide(row, stale)


@SETTINGS
@given(rows_and_requests)
def test_a_released_or_releasing_table_takes_nothing_new(case: tuple[TableRow, RatifyRequest]) -> None:
    row, request = case
    for state in (RELEASING, RELEASED):
        fresh = replace(request, version=max(request.version, row.latest + 1), recorded=None)
        out = decide(replace(row, state=state), fresh)
        assert isinstance(out, Refuse) and not out.conflict.retryable, (state, out)
    # a released table also refuses versions it once had: the writer re-reads the (filesystem) table
    old = replace(request, version=min(request.version, row.latest))
    out = decide(replace(row, state=RELEASED), old)
    assert isinstance(out, Refuse) and out.conflict.retryable


@SETTINGS
@given(rows_and_requests)
def test_a_staged_file_that_cannot_be_accepted_is_an_error_only_when_it_matters(
    case: tuple[TableRow, RatifyRequest],
) -> None:
    row, request = case
    row = replace(row, state=ACTIVE)
    ok = replace(request, version=row.latest + 1, ict=row.latest_ict + 1, recorded=None)
    if acceptable(ok):
        assert isinstance(decide(row, ok), Ratify)
    else:
        with pytest.raises(FeedlogError):
            decide(row, ok)
    # the verdict is not consulted for a request refused anyway (taken, gap): a bad file is then a conflict
    for version in (row.latest, row.latest + 2):
        assert isinstance(decide(row, replace(ok, version=version, checked=BAD_FILE)), Refuse)


@SETTINGS
@given(rows, st.data())
def test_a_repeated_request_after_acceptance_is_recognised(row: TableRow, data: st.DataObject) -> None:
    row = replace(row, state=ACTIVE)
    release = data.draw(st.booleans())
    request = RatifyRequest(
        row.latest + 1, NAMES[1], row.latest_ict + 5, release, None, None if release else KEEPS_OWNER
    )
    out = decide(row, request)
    assert isinstance(out, Ratify)
    after = replace(row, latest=out.version, latest_ict=out.ict, state=out.state)
    assert decide(after, replace(request, recorded=NAMES[1])) == Repeat(out.version)
    other = replace(request, staged=NAMES[2], recorded=NAMES[1])  # another writer's file for that version
    refused = decide(after, other)
    assert isinstance(refused, Refuse) and refused.conflict.retryable


# ---- a model of the owner: random requests from several writers ---------------------------------


@dataclass(frozen=True)
class Step:
    writer: int
    #: the version asked for, relative to the latest the writer last saw
    offset: int
    ict_step: int
    release: bool
    #: after this request, the owner backfills and forgets its ratified commits
    backfill: bool


steps = st.builds(
    Step,
    st.integers(0, 3),
    st.integers(-2, 2),
    st.integers(-3, 1000),
    st.integers(0, 19).map(lambda n: n == 0),
    st.integers(0, 3).map(lambda n: n == 0),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(steps, max_size=60))
def test_a_random_request_sequence_never_ratifies_two_commits_for_one_version(plan: list[Step]) -> None:
    row = table_row(ACTIVE, 0, T0, 0)
    tracked: dict[int, str] = {}  # the owner's un-backfilled commits: version -> staged file
    history: dict[int, tuple[str, int]] = {0: ("commit-0", T0)}  # every ratified version: (file, ict)
    seen = [0, 0, 0, 0]  # the latest each writer has read
    released_at: int | None = None
    for step in plan:
        version = seen[step.writer] + 1 + step.offset
        staged = f"{version}-w{step.writer}"  # a writer that asks again for a version sends the same file
        ict = row.latest_ict + step.ict_step
        verdict = None if step.release else KEEPS_OWNER
        recorded = tracked.get(version) if version <= row.latest else None
        out = outcome_of(row, RatifyRequest(version, staged, ict, step.release, recorded, verdict))
        if isinstance(out, Ratify):
            assert out.version not in history, f"version {out.version} ratified twice"
            assert released_at is None, f"version {out.version} ratified after the release at {released_at}"
            if out.state == RELEASING:
                released_at = out.version
            assert out.version == row.latest + 1 and out.ict > row.latest_ict
            history[out.version] = (staged, out.ict)
            tracked[out.version] = staged
            row = replace(row, latest=out.version, latest_ict=out.ict, state=out.state)
            seen[step.writer] = out.version
        elif isinstance(out, Repeat):
            assert history[out.version][0] == staged  # only ever the file that was ratified
            seen[step.writer] = max(seen[step.writer], out.version)
        elif isinstance(out, Refuse):
            if out.conflict.retryable:
                seen[step.writer] = row.latest  # the loser re-reads the table and tries again after it
        else:
            assert isinstance(out, InvalidArgument) and ict <= row.latest_ict  # only a stale ICT here
        if step.backfill:
            tracked.clear()
            row = replace(row, backfilled=row.latest, state=RELEASED if row.state == RELEASING else row.state)
    assert sorted(history) == list(range(row.latest + 1))  # contiguous: no version skipped, none doubled
    icts = [history[v][1] for v in sorted(history)]
    assert icts == sorted(set(icts))  # in-commit timestamps strictly increase with the version


# ---- registration ------------------------------------------------------------------------------


@SETTINGS
@given(
    st.none() | rows | st.builds(make_proposal_for, st.integers(0, 50), st.sampled_from(NAMES)),
    st.none() | st.just("another-table-id"),
    st.integers(0, 50),
    st.sampled_from(NAMES),
)
def test_registration_proposes_repeats_or_refuses(
    row: TableRow | None, other_at_path: str | None, version: int, staged: str
) -> None:
    if row is not None and row.state != RELEASED:
        # the table is managed here (or being registered): only the very same proposal is a repeat
        if row.proposal_version == version and row.proposal_file == staged:
            assert decide_register(row, other_at_path, "/tables/t", version, staged) == Repeat(version)
        else:
            with pytest.raises(AlreadyExists):
                decide_register(row, other_at_path, "/tables/t", version, staged)
    elif other_at_path is not None:  # one managed table per path
        with pytest.raises(AlreadyExists, match="another table"):
            decide_register(row, other_at_path, "/tables/t", version, staged)
    else:
        assert decide_register(row, other_at_path, "/tables/t", version, staged) is None


@SETTINGS
@given(st.integers(0, 50), st.sampled_from(NAMES), st.integers(T0, T0 + 10**6), st.integers(1, 5))
def test_a_proposal_has_nothing_ratified_and_repeats_itself(version: int, staged: str, ict: int, batch: int) -> None:
    row = make_proposal("table-id", "/tables/t", "hash", None, version, staged, ict, batch)
    assert (row.state, row.latest, row.backfilled) == (PROPOSED, version - 1, version - 1)
    assert (row.proposal_version, row.proposal_file, row.proposal_ict, row.batch_size) == (version, staged, ict, batch)
    assert decide_register(row, None, "/tables/t", version, staged) == Repeat(version)  # its answer was lost


@SETTINGS
@given(st.integers(1, 50), st.sampled_from(NAMES), st.data())
def test_a_proposal_still_to_settle_ratifies_nothing(version: int, proposed: str, data: st.DataObject) -> None:
    # the table's latest is not known until the proposal settles (its commit lands, or another did)
    row = make_proposal("table-id", "/tables/t", "hash", None, version, proposed, T0, 1)
    request = data.draw(requests(replace(row, state=ACTIVE, latest_ict=T0)))
    assert not isinstance(outcome_of(row, request), Ratify)


# ---- routing -----------------------------------------------------------------------------------

bindings = st.sampled_from(
    [
        None,
        Binding.feedlog(endpoint="grpc://127.0.0.1:7000"),
        Binding.feedlog(endpoint="grpc://127.0.0.1:7001"),
        Binding.feedlog(db="/owners/a.db"),
    ]
)


@SETTINGS
@given(bindings, bindings, st.booleans())
def test_route_follows_the_ownership_before_and_after(
    before: Binding | None, after: Binding | None, same_table: bool
) -> None:
    if before is None:
        assert route(before, after, same_table) == (Route.FILESYSTEM if after is None else Route.REGISTER)
    elif after is None:
        assert route(before, after, same_table) == Route.RELEASE
    elif after == before and same_table:
        assert route(before, after, same_table) == Route.COMMIT
    else:  # a new owner, or the table replaced under its owner: through the filesystem, in two steps
        with pytest.raises(InvalidArgument, match="two steps"):
            route(before, after, same_table)
