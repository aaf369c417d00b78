"""The torchtitan side of ``slurm-titan data prepare``: the job's tokenizer (torchtitan's
``HuggingFaceTokenizer``, BOS and EOS added as its text loader adds them), run in each worker process.

The command imports this module only when it runs (the no-torch contract's one exception for it); the
orchestration is torch-free (:mod:`slurm_titan.data.prepare`).
"""

from __future__ import annotations

from functools import lru_cache

from torchtitan.components.tokenizer import HuggingFaceTokenizer

from slurm_titan.data.megatron_index import ShardWriter
from slurm_titan.data.prepare import ShardJob, read_documents
from slurm_titan.data.token_manifest import TokenizerInfo
from slurm_titan.data.token_names import ShardError


@lru_cache(maxsize=1)
def load(tokenizer_dir: str) -> HuggingFaceTokenizer:
    try:
        return HuggingFaceTokenizer(tokenizer_path=tokenizer_dir)
    except (OSError, ValueError) as error:  # torchtitan's: a missing folder or file, a file it cannot parse
        raise ShardError(f"{tokenizer_dir}: cannot load the tokenizer: {error}") from None


def describe(tokenizer_dir: str) -> TokenizerInfo:
    return TokenizerInfo.of(load(tokenizer_dir))


def make_shard(job: ShardJob) -> None:
    """Tokenise the shard's documents as the job's text loader would (``encode(text, add_bos, add_eos)``)."""
    tokenizer = load(job.tokenizer)
    with ShardWriter(job.prefix, job.dtype) as shard:
        for text in read_documents(job):
            shard.add_document(tokenizer.encode(text, add_bos=True, add_eos=True))
