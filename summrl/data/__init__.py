"""Documents with their questions: Repliqa (hub or local files in its schema) or the user's own documents
(``dataset=documents``), split into val/train with a seeded shuffle. Questions for documents that have none are
written by the judge (:mod:`summrl.judges.questions`); :mod:`summrl.splits` puts the pieces together."""

from summrl.data.document import UNANSWERABLE, Document, Question, resolve_path
from summrl.data.repliqa import REPLIQA_COLUMNS, all_documents, group_documents, load_splits
from summrl.data.split import DataError, split, split_counts

__all__ = [
    "REPLIQA_COLUMNS",
    "UNANSWERABLE",
    "DataError",
    "Document",
    "Question",
    "all_documents",
    "group_documents",
    "load_splits",
    "resolve_path",
    "split",
    "split_counts",
]
