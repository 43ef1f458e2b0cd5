"""Regenerate docs/configuration.md and docs/configuration.zh-CN.md from the config classes
(the single source of every flag's default and help). ``--check`` exits 1 when stale."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrec.config import EngineConfig, ServerConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

SERVE_ENV = [  # scripts/serve.sh variable -> flag
    ("MODEL_PATH", "--model-path"),
    ("SID_VOCAB_FILE", "--sid-vocab-file"),
    ("SID", "--sid"),
    ("HOST", "--host"),
    ("PORT", "--port"),
    ("CUDA_VISIBLE_DEVICES", "(environment: which GPU)"),
    ("QUANTIZATION", "--quantization"),
    ("KV_CACHE_DTYPE", "--kv-cache-dtype"),
    ("MEM_FRACTION_STATIC", "--mem-fraction-static"),
    ("CUDA_GRAPH_MAX_BS", "--cuda-graph-max-bs"),
    ("BATCH_SLOTS", "--batch-slots"),
    ("BEAM_WIDTH", "--beam-width"),
    ("LPM_AGING_MS", "--lpm-aging-ms"),
    ("EXTRA_SERVER_ARGS", "(appended verbatim)"),
]

ENV_VARS = {
    "FLASHREC_PREFILL_BUCKET": (
        "`32`, `64` or `128` (default): the token bucket of the one-prompt prefill graphs "
        "(`--prefill-graph-max-tokens`); a prompt is padded up to a multiple of it, so a smaller "
        "bucket pads less and captures more graphs at start; an A/B knob",
        "`32`、`64` 或 `128`（默认）：单 prompt prefill 图（`--prefill-graph-max-tokens`）的 token "
        "分桶；prompt 补齐到它的整数倍，桶越小补齐越少、启动时捕获的图越多；A/B 开关",
    ),
    "FLASHREC_ANSWER_ON_ENGINE": (
        "`idle` = a one-prompt, unstreamed answer's body (chat or `/generate`) is built by the "
        "engine thread right after the results when that thread has nothing else to do, so the "
        "event loop only sends it; `off` (default) = the handler builds it. Only with the engine "
        "in the server process (`--engine-process off`); an A/B knob",
        "`idle` = 单 prompt、非流式回答的 body（chat 或 `/generate`）在引擎线程空闲时由它在结果"
        "生成后立即构建，事件循环只负责发送；`off`（默认）= 由 handler 构建。仅在引擎与服务同进程"
        "（`--engine-process off`）时生效；A/B 开关",
    ),
    "FLASHREC_TORCH_PROFILER_DIR": (
        "where /start_profile writes traces (output_dir must resolve inside it); default ./profiles",
        "/start_profile 的 trace 落盘目录（output_dir 必须位于其内）；默认 ./profiles",
    ),
    "FLASHREC_DEBUG_STEP_HASH": (
        "1 = log a STEP_HASH line per request and step (forward inputs and outputs) for determinism debugging",
        "1 = 每个请求每一步打印 STEP_HASH（前向输入与输出的哈希），用于定位不确定性",
    ),
    "FLASHREC_NVTX": (
        "0 = no NVTX ranges from trace_range on CUDA",
        "0 = 在 CUDA 上不发出 trace_range 的 NVTX 区间",
    ),
    "FLASHREC_CACHE": (
        "cache root of flashrec-bench's synthetic models (default ~/.cache/flashrec)",
        "flashrec-bench 合成模型的缓存根目录（默认 ~/.cache/flashrec）",
    ),
    "FLASHREC_TEST_STEP_DELAY_MS": (
        "TEST ONLY, not read by flashrec: where `tests/plants` is on PYTHONPATH (the tests, "
        "scripts/gate_calibration.py), every step of the engine loop sleeps this long after it "
        "(a planted slowdown for the gate tests)",
        "仅测试用，flashrec 本身不读取：`tests/plants` 在 PYTHONPATH 上时（测试、"
        "scripts/gate_calibration.py），引擎循环每个 step 后休眠该毫秒数（性能门禁测试的人为减速）",
    ),
    "FLASHREC_TEST_STEP_GATE": (
        "TEST ONLY, not read by flashrec: where `tests/plants` is on PYTHONPATH, a file path; "
        "every step of the engine loop then waits until that file exists (requests held in "
        "flight on any machine, for the cancel and drain tests)",
        "仅测试用，flashrec 本身不读取：`tests/plants` 在 PYTHONPATH 上时为一个文件路径；引擎循环"
        "每个 step 后等待该文件出现（在任何机器上让请求保持在途，供取消与排空测试使用）",
    ),
    "FLASHREC_TEST_RELOAD_GATE": (
        "TEST ONLY, not read by flashrec: where `tests/plants` is on PYTHONPATH, a file path; "
        "every catalog hot reload first waits until that file exists (a reload held in flight "
        "for the shutdown tests)",
        "仅测试用，flashrec 本身不读取：`tests/plants` 在 PYTHONPATH 上时为一个文件路径；每次目录"
        "热更新先等待该文件出现（让热更新保持在途，供关停测试使用）",
    ),
    "FLASHREC_TEST_PLANT_ID_CACHE": (
        "TEST ONLY, not read by flashrec: where `tests/plants` is on PYTHONPATH, plant a host "
        "cache of prompt slots keyed by id(state) (the historical nondeterminism) for the "
        "determinism tests",
        "仅测试用，flashrec 本身不读取：`tests/plants` 在 PYTHONPATH 上时，植入以 id(state) 为键的"
        " prompt slot host 缓存（历史上的不确定性根因），供复现性测试使用",
    ),
}

ZH = {
    "model_path": "HF 格式 checkpoint 目录（config.json、tokenizer、safetensors）",
    "sid_vocab_file": "合法 SID 目录（逗号键 JSON、RecIF sid2pid.json 或 pid2sid parquet、列表 JSON 或文本行）；可重复，写作 NAME=PATH 即为具名目录，请求用 'catalog' 字段选择（第一个为默认；不带名字的文件名为 'default'）；不设时对 SID codebook 做无约束解码（仅冒烟）",
    "packed_base": "目录中打包整数键写入时所用的进制 B（a*B^2 + b*B + c；也是 /update_catalog 的 packed_base 的默认值）；默认 8192，即 RecIF 的 sid2pid.json，绝不取模型的 codebook 大小",
    "max_catalog_bytes": "读取的目录文件最大字节数（--sid-vocab-file、/update_catalog；0 = 不限）；目录路径必须是普通文件（FIFO 或设备文件会被拒绝并说明原因）",
    "catalog_read_timeout_s": "目录文件须在这么多秒内读完（0 = 不限），否则被拒绝（/update_catalog 返回 400）",
    "sid": "覆盖 SID 布局：START:END/SIZE[,begin=ID][,end=ID]（token id START..END-1 为每级 SIZE 个 code 的 codebook）",
    "device": "cpu 或 cuda（默认：有 GPU 时 cuda）",
    "dtype": "激活 / 非量化权重的 dtype（默认 cuda 上 bfloat16，cpu 上 float32）",
    "quantization": "fp8 = W8A8 per-channel FP8（BF16 权重在加载时量化）；其它任何值 = --dtype 的非量化权重；默认：仅当 checkpoint 的 quantization_config 声明 FP8 时启用 FP8",
    "kv_cache_dtype": "KV cache dtype：auto（= --dtype）或 fp8_e4m3",
    "logprob_scope": "log_softmax 的范围：当前层 code（level，默认最快）/ 整个 SID 区间（sid）/ 全词表（full，HF 语义）",
    "length_penalty": "sequence_score = cum_logprob / gen_len ** length_penalty",
    "beam_width": "默认 beam 宽度 n（请求中的 n 覆盖它）；也是 CUDA graph 捕获的单位",
    "batch_slots": "所有运行中请求共享的 beam 行槽位预算（默认 = --cuda-graph-max-bs）",
    "cuda_graph_max_bs": "以 CUDA graph 捕获的最大 decode 批（beam 行数）；更宽的批按整请求多次重放，n 超过它的请求 eager decode",
    "disable_cuda_graph": "decode 走 eager（从不静默回退）",
    "prefix_cache_min_match": "短于该 token 数的 radix 匹配不使用，prompt 整段 prefill（从 pool gather 很短的前缀比重算更贵）",
    "prefix_cache_max_nodes": "radix 前缀缓存最多保留的节点数（运行中请求持有的节点之外）；超过时逐出最久未用、无人引用的 prompt（限定大量互不相同的短 prompt 占用的主机内存）；0 = 只受 KV pool 限制",
    "piecewise_prefill_max_tokens": "新 token 数不超过该值的 prefill 批重放逐层 CUDA graph，attention 在其间 eager 运行；0 = 关闭；不超过 --max-prefill-tokens；默认：捕获 CUDA graph 时为 8192，否则为 0",
    "prefill_graph_max_tokens": "单独一个、无缓存前缀且不超过该 token 数的 prompt 重放整段前向的 CUDA graph（按 128 token 分桶）；0 = 关闭；默认：捕获 CUDA graph 时为 2048，否则为 0",
    "enable_step_graph": "把每个 decode step 整体（前向、LM head、trie 掩码、top-n、beam 扩展、KV 重排）捕获为一个 CUDA graph；默认：捕获 decode CUDA graph 时开启",
    "overlap_results": "一个 step 完成的请求在下一个 step 的 GPU 工作发出之后才交回，使 host 构建回答时 GPU 不空闲；默认：使用 CUDA 时开启",
    "decode_max_splits": "GPU beam-decode attention 在窄 batch 上对 prompt 的最大切分数（split-K，1-8；1 = 不切分）",
    "decode_prompt_attention": "GPU beam-decode attention 的 prompt 部分：triton（一个 kernel，连同每个 beam 自己的 key）、flashinfer（在 >= 512 行的 batch 上用 FlashInfer 的 prefill：BF16 pool 上直接 paged，FP8 pool 则先把 prompt 暂存为 BF16 再 ragged；再用一个 kernel 合并 beam 自己的 key；需要 --attention-backend flashinfer）或 auto：Hopper GPU 上，bfloat16 KV cache，或 FP8 KV cache 且 --beam-width >= 256 时用 flashinfer（--deterministic 下不用），否则 triton",
    "attention_backend": "attention 后端：torch（参考实现，CPU）、triton（GPU：SDPA prefill + Triton beam decode）或 flashinfer（GPU：FlashInfer ragged prefill + Triton beam decode）；默认：flashinfer 支持该模型时用 flashinfer，否则 triton；CPU 上用 torch",
    "max_seq_len": "最长可接受 prompt（token）；更长返回 400",
    "max_prefill_tokens": "一次前向中一起 prefill 的 token 数",
    "mem_fraction_static": "分给权重 + KV pool 的空闲显存比例",
    "kv_pool_tokens": "prompt KV pool 大小（token）；默认按空闲显存计算（计入 --decode-prompt-attention flashinfer 在 FP8 pool 旁保留的同样长度的 bfloat16 暂存缓冲区），CPU 上 262144",
    "enable_prefix_cache": "prompt token 上的 radix 前缀缓存",
    "schedule_policy": "准入顺序：最长前缀匹配（带老化）或先来先服务",
    "lpm_aging_ms": "LPM 老化：等待超过该时长的请求按到达顺序优先于最长前缀匹配顺序准入（不饿死）",
    "max_queue_len": "排队请求上限，超过返回 503",
    "enable_fused_rms_fp8": "融合 RMSNorm(+residual) -> per-token FP8 量化 kernel（GPU，FP8）；bf16/fp16 层使用同一 kernel（不量化）",
    "enable_fused_silu_fp8": "融合 SiLU(gate)*up -> per-token FP8 量化 kernel（GPU，FP8）；bf16/fp16 层使用同一 kernel（不量化）",
    "enable_fused_qk_rope_kv": "融合 q/k RMSNorm + RoPE + KV 写入 kernel（GPU）",
    "qk_rope_rounding": "融合 q/k norm + RoPE + KV 写入 kernel 舍入到 bf16 的方式（GPU）：hardware（内联 PTX 转换指令，更快）或 emulated（整数运算）；两者都与 HF 逐位相同",
    "deterministic": "批不变（batch-invariant）服务：一个请求的 beam、分数与顺序不随同批的其他请求而变（decode GEMM 固定归约顺序，每个 prompt 单独一次 prefill forward，不用前缀缓存，decode 注意力不切分 prompt）",
    "weights_build": "/update_weights_from_disk 在 CPU 上对新 checkpoint 计算哈希并构建模型的位置：server（持有引擎的进程）或 child（一个低优先级的子进程，让这部分工作不占服务进程的 CPU 核与解释器锁，代价是更新更慢、主机内存中多一份副本）",
    "enable_prefill_last_rows": "prefill 时最后一层的 o_proj、注意力后 norm 与 MLP 只算每个 prompt 的最后一个 token（level-0 logits 只读这一行）：约省 GEMM 的 1/L",
    "host": "绑定地址（服务无鉴权：保持 loopback）",
    "port": "绑定端口（0 = 自动选择并打印）",
    "served_model_name": "/v1/models 报告的模型名（默认目录名）",
    "max_body_bytes": "最大请求体字节数（超过返回 413）",
    "shutdown_timeout_s": "收到 SIGTERM 后等待在途请求完成的时长",
    "max_connections": "每个前端进程保持的客户端连接上限；再多一个连接时回 503 并关闭。0 = 自动：打开文件数上限（ulimit -n）减去进程启动时已占用的描述符，再留 64 个余量",
    "header_timeout_s": "请求头须在其第一个字节后（连接的首个请求：连接建立后）这么多秒内收全，否则返回 408 并关闭连接",
    "body_timeout_s": "请求体须在请求头收全后这么多秒内全部到达，否则返回 408 并关闭连接",
    "warmup": "/health 返回 ok 之前先跑预热请求",
    "gc_freeze": "预热后把所有存活对象移入 Python GC 的永久代（gc.freeze）：完整回收（同样会暂停引擎线程）此后只遍历请求分配的对象",
    "gc_gen0_threshold": "每个 server 进程中两次第 0 代垃圾回收之间的分配次数（gc.set_threshold）；0 保持 Python 的默认值（700）。更大：回收次数更少，每次遍历更多对象，总共遍历的对象更少",
    "respond_workers": "并行构建宽回答（至少 64 个 beam、非流式）JSON 正文的进程数，不占事件循环；0 = 在事件循环上构建",
    "tokenizer_workers": "并行构建 prompt（chat template + 分词）的线程数，每个线程持有自己的 tokenizer 副本；1 = 单线程使用引擎自身的 tokenizer；不超过 32,768 个字符、且其请求是唯一在处理的请求时，prompt 改在事件循环上构建（FLASHREC_PROMPT_INLINE=off 仍用线程）",
    "gil_switch_interval_ms": "服务进程的 sys.setswitchinterval（毫秒）：引擎线程等待 GIL 时，HTTP / 分词线程最多可持有 GIL 的时长（Python 默认 5）",
    "engine_process": "引擎（调度器、模型、profiler）运行在独立进程中，使 HTTP、分词和响应文本永远不占用它的 GIL：on、off 或 auto（使用 CUDA 或 --api-server-count > 1 时开启）",
    "api_server_count": "共享同一端口的 HTTP 前端进程数（SO_REUSEPORT 把新连接分给它们），每个有自己的事件循环、GIL 和分词器，全部接到同一个引擎进程：用于短 prompt、高请求率下单个进程的 GIL 成为瓶颈的场景",
    "event_loop": "server 的事件循环：asyncio（标准库）、uvloop（pip install 'flashrec[fast]'；在此实测与 asyncio 持平），或 auto（已安装时用 uvloop）",
}

GENERATE_FLAGS = [
    (
        "--prompt TEXT",
        "one user message (chat template applied)",
        "一条 user 消息（套用 chat template）",
    ),
    ("--messages-json F", "file with a JSON list of chat messages", "包含 JSON 消息列表的文件"),
    (
        "--input-ids 1,2,3",
        "raw prompt ids, used as-is (only <|sid_begin|> appended if not last)",
        "原始 prompt id，原样使用（仅在末尾不是 <|sid_begin|> 时追加）",
    ),
    (
        "--max-tokens K",
        "cap on generated tokens (default: catalog depth + 1)",
        "生成 token 上限（默认：目录深度 + 1）",
    ),
    (
        "--temperature T",
        "0 = deterministic top-n; > 0 = Gumbel top-n (scores exclude the noise)",
        "0 = 确定性 top-n；> 0 = Gumbel top-n（分数不含噪声）",
    ),
    ("--seed S", "seed of the request's Gumbel noise", "请求 Gumbel 噪声的种子"),
    ("--json", "print the result as JSON", "以 JSON 输出"),
]


# What a flag's one-line help leaves out: the details and the reason for its default.
NOTES = [
    (
        "--packed-base",
        "A catalog key without a comma (RecIF's sid2pid.json, as flashrec-bench eval-dataset "
        "writes it) packs the codes a*B^2 + b*B + c in the base B it was written in, whatever "
        "the model: with 64 codes per level, key 90121 is still (0,11,9), never (22,0,9). A "
        "decoded code at or beyond the codebook size is an inexpressible SID: the file is "
        "refused with the count and the first one named (`flashrec catalog` lists them). "
        "`flashrec catalog`, this flag, /update_catalog's packed_base, flashrec-bench eval and "
        "the harness's SID checks all read keys with one decoder.",
        "不含逗号的目录键（RecIF 的 sid2pid.json，即 flashrec-bench eval-dataset 写出的格式）按写入"
        "时的进制 B 打包为 a*B^2 + b*B + c，与模型无关：每级 64 个 code 时键 90121 仍是 (0,11,9)，"
        "绝不会是 (22,0,9)。解出的 code 达到或超过 codebook 大小时即为无法表达的 SID：文件被拒绝，"
        "并给出数量与第一个 SID（`flashrec catalog` 会逐个列出）。`flashrec catalog`、本参数、"
        "/update_catalog 的 packed_base、flashrec-bench eval 与 harness 的 SID 检查都用同一个解码器读键。",
    ),
    (
        "--quantization",
        "An FP8 checkpoint served with any value other than fp8 is dequantized to --dtype. The "
        "checkpoint's quantization_config decides on any device; a directory name containing "
        "fp8 does not count.",
        "FP8 checkpoint 配合 fp8 以外的任何值时反量化为 --dtype。由 checkpoint 的 "
        "quantization_config 决定，与设备无关；目录名含 fp8 不算。",
    ),
    (
        "--cuda-graph-max-bs",
        "Eager decodes are logged and counted in /metrics "
        "(`flashrec_decode_eager_forwards_total`).",
        "eager decode 会打印日志并计入 /metrics（`flashrec_decode_eager_forwards_total`）。",
    ),
    (
        "--enable-step-graph",
        "Only for batches whose requests all have n = --beam-width and temperature 0; other "
        "batches run the model graph and expand beams eagerly. On CPU (off by default) the same "
        "static step runs eagerly. --no-enable-step-graph captures the model forward only.",
        "仅用于批内请求都满足 n = --beam-width 且 temperature 0 的批；其它批走模型 graph 并 "
        "eager 扩展 beam。CPU 上（默认关闭）同一静态 step 以 eager 运行。"
        "--no-enable-step-graph 只捕获模型前向。",
    ),
    (
        "--overlap-results",
        "Only while other requests wait or run: the device-to-host copy of the results starts "
        "at once and the host waits for it only once the GPU has more work queued. Nothing "
        "waits longer than the next step's launches; with nothing else to run, results come "
        "back at once, so one request at a time is unaffected. Off on CPU, where the host and "
        "the device share the cores; --no-overlap-results hands every result back in its own "
        "step.",
        "仅当还有其他请求在等待或运行时：结果的 device-to-host 拷贝立即开始，host 只在 GPU "
        "已有后续工作时才等待它。任何结果的等待都不超过下一个 step 的 launch；没有其他工作时"
        "结果立即交回，逐个请求时不受影响。CPU 上关闭（host 与 device 共用 CPU 核）；"
        "--no-overlap-results 让每个结果在本 step 交回。",
    ),
    (
        "--prefill-graph-max-tokens",
        "Replays only while no other request runs: a latency knob for one request at a time, "
        "where eager launches dominate. Padding tokens write to reserved scratch slots; "
        "attention goes through SDPA; radix matches shorter than one bucket are recomputed "
        "(in effect --prefix-cache-min-match 128). On CPU a non-zero value runs the same "
        "padded forward eagerly.",
        "仅在没有其他请求运行时重放：面向逐请求延迟（eager launch 开销占主导时）。padding "
        "token 写入预留的 scratch 槽位；attention 走 SDPA；短于一个桶的 radix 匹配随之重算"
        "（相当于 --prefix-cache-min-match 提到 128）。CPU 上设非零值时同一 padding 前向以 eager 运行。",
    ),
    (
        "--piecewise-prefill-max-tokens",
        "Any number of prompts up to 256, cached prefixes included, where the whole-forward "
        "prefill graph does not apply. One graph per layer for everything but attention, "
        "captured per token bucket (steps of 256 / 512 / 1,024 tokens); attention runs eagerly "
        "on the real tokens between them and padding tokens write to reserved scratch slots. "
        "It cuts the ~10 launches per layer of an eager prefill to one replay plus the "
        "attention call. The layers write their state straight into the graphs' static buffers "
        "(the QKV GEMM into the q/k/v rows, the norms the residual in place), so on the GPU the "
        "price is the padding and one copy per forward (the embeddings); large batches are "
        "GPU-bound and gain little, hence 8192 (see the tuning table). On CPU a non-zero value "
        "runs the same padded pieces eagerly.",
        "任意条 prompt（至多 256 条，含缓存前缀），用于不走整段 prefill graph 的批。每层除 "
        "attention 以外的部分各一张 graph，按 token 桶（步长 256 / 512 / 1,024）捕获，"
        "attention 在两段之间以 eager 方式只在真实 token 上运行，padding token 写入预留的 "
        "scratch 槽位。把 eager prefill 每层约 10 次 launch 降为一次重放加一次 attention "
        "调用。各层把状态直接写进 graph 的静态缓冲区（QKV GEMM 写入 q/k/v 行，norm 原地更新 "
        "residual），因此 GPU 上的代价是 padding 加每次 forward 一次拷贝（embedding）；大批次"
        "受 GPU 限制、收益甚微，因此默认 8192（见调优表）。CPU 上设非零值时同一组 padding "
        "分段以 eager 运行。",
    ),
    (
        "--attention-backend",
        "The default takes flashinfer where it is installed and the model is bf16 / fp16 with "
        "head_dim 64, 128 or 256. Both GPU backends decode through FlashRec's shared-prompt "
        "Triton beam kernel.",
        "默认在已安装 flashinfer 且模型为 bf16 / fp16、head_dim 为 64、128 或 256 时用 "
        "flashinfer。两个 GPU 后端都用 FlashRec 共享 prompt 的 Triton beam decode kernel。",
    ),
    (
        "--prefix-cache-min-match",
        "A short shared prefix such as the chat template's first tokens costs more to gather "
        "from the pool, per layer and for the whole batch, than to recompute.",
        "像 chat template 开头这类很短的共享前缀，从 pool 按层、按整个 batch gather 的代价高于重算。",
    ),
    (
        "--prefix-cache-max-nodes",
        "The KV pool bounds the tokens the cache holds, not the host objects that index them: "
        "each distinct prompt adds a node or two (a few hundred bytes of host memory), so many "
        "short distinct prompts (a user id or a counter in a short prompt) would grow the "
        "server's memory until the whole pool is cached (262,144 tokens on CPU: tens of "
        "thousands of requests). Long prompts fill the pool long before the default cap. "
        "/metrics reports the count (flashrec_prefix_cache_nodes).",
        "KV pool 限定的是缓存持有的 token，而不是索引它们的主机对象：每个互不相同的 prompt 会增加一两个"
        "节点（几百字节主机内存），因此大量互不相同的短 prompt（短 prompt 里带用户 id 或计数器）会让服务"
        "进程内存一直增长，直到整个 pool 都被缓存（CPU 上 262,144 个 token：数万个请求）。长 prompt 远在"
        "达到默认上限之前就会占满 pool。/metrics 报告节点数（flashrec_prefix_cache_nodes）。",
    ),
    (
        "--qk-rope-rounding",
        "hardware puts the conversion instruction in inline PTX, which the compiler cannot "
        "fold; emulated takes ~5 integer instructions per rounding. Both round to nearest even "
        "wherever HF rounds. The e4m3 cache codes are rounded in integer arithmetic either way.",
        "hardware 把转换指令写在编译器无法折叠的内联 PTX 中；emulated 每次舍入约 5 条整数指令。"
        "两者都在 HF 舍入之处按最近偶数舍入。e4m3 缓存码两种方式都用整数运算舍入。",
    ),
    (
        "--enable-prefill-last-rows",
        "Every token still writes its K/V and every earlier layer runs whole. "
        "--no-enable-prefill-last-rows runs every token through the whole last layer (the same "
        "results within rounding: the GEMMs see fewer rows).",
        "每个 token 仍写入各层 K/V，之前各层照常全算。--no-enable-prefill-last-rows 让所有 "
        "token 走完整最后一层（结果在舍入误差内相同：GEMM 行数不同）。",
    ),
    (
        "--tokenizer-workers",
        "The copies share the engine tokenizer's model, whose BPE word cache is capped at "
        "10,000 words over all the prompt-building threads (the workers and the large-prompt "
        "lane: 2,000 words each with 4 workers). Since tokenizers 0.23 each thread keeps a cache "
        "of its own, filled up to the model's capacity and never evicted: at the library's "
        "10,000 words a thread, distinct prompts grew the front end by up to that many words "
        "per thread (~0.4 KB a short word, ~7 KB a 200-byte one). Each copy keeps its own "
        "truncation and padding state.",
        "各副本共用引擎 tokenizer 的模型，其 BPE 词缓存在所有构建 prompt 的线程（各 worker 与大 "
        "prompt 通道；4 个 worker 时每线程 2,000 词）之间合计最多 10,000 个词。tokenizers 0.23 起"
        "每个线程各有一份缓存，填到模型容量为止且从不淘汰：按库默认每线程 10,000 词，互不相同的 "
        "prompt 会让前端每个线程最多多占这么多词（短词约 0.4 KB，200 字节的词约 7 KB）。每个副本仍"
        "保有自己的截断与 padding 状态。",
    ),
    (
        "--respond-workers",
        "The answers of requests that retire in one step are otherwise built one after another "
        "on the event loop. 0 by default: the workers pay off only where they have cores of "
        "their own (see the tuning table).",
        "否则同一步结束的请求的回答只能在事件循环上逐个构建。默认 0：工作进程只有在拥有自己的 "
        "CPU 核时才划算（见调优表）。",
    ),
    (
        "--event-loop",
        "asyncio is the default: uvloop measured level with it (see the tuning table).",
        "默认 asyncio：uvloop 实测与之持平（见调优表）。",
    ),
]


def _flag(f) -> str:
    return "--" + f.name.replace("_", "-")


def _default(f) -> str:
    d = f.default
    if d == "":
        return "required"
    return "-" if d is None else f"`{d}`"


# Knobs by situation and why each default is what it is. The figures behind them, each with
# its command, commit, machine and date, are in docs/baselines.md ("A/B decisions").
TUNING_EN = [
    "Why each default is what it is. The measurements behind them (the lent H200 with the "
    "synthetic onerec-1.7b preset unless marked CPU), each with its command, commit, machine "
    'and date, are in `docs/baselines.md`, section "A/B decisions".',
    "",
    "| situation | knob | why |",
    "| --- | --- | --- |",
    "| one request at a time, prompt <= 2,048 tokens | `--prefill-graph-max-tokens` (2048 on GPU by default; replays only while nothing else runs) | an eager prefill of one prompt is launch-bound: the captured forward halves the p=1,000 latency |",
    "| prefill batches under load of a few prompts | `--piecewise-prefill-max-tokens` (8192 on GPU by default) | the per-layer graphs lift the wide and long-prompt cells; above 8,192 tokens the padding costs more than the graphs save, so larger batches stay eager |",
    "| many concurrent requests | `--gil-switch-interval-ms` (0.2 by default; Python's is 5) | the HTTP and tokenizer threads hand the GIL back to the engine thread sooner: more QPS under load, no change at c=1 |",
    "| wide answers that retire together (n >= 64) | `--respond-workers` (0 by default) | worker processes pay off only where they have cores of their own: faster on the H200 host at n=512 and p=5,000 (`matrices/h200_targets.yaml` sets 4 there), slower on a 2-core machine |",
    "| bursts of long prompts | `--tokenizer-workers` (4 by default) | prompts are built in parallel (the Rust encoder releases the GIL): shorter tokenize waits at c=8 |",
    "| long-running servers | `--gc-freeze` (on by default) | the objects alive after the warm-up leave the collector's generations, so a full collection pauses the server far more briefly; GC pauses are in `/metrics` (`flashrec_gc_*`) |",
    "| whole decode step as one graph | `--enable-step-graph` (on by default where decode CUDA graphs are captured; `--no-enable-step-graph` turns it off) | the LM head, trie, top-n, expansion and KV reorder replay with the model: fewer launches per step, same beams |",
    "| every beam of every request in flight | `--batch-slots` = `--cuda-graph-max-bs` >= n x concurrency | the H200 target matrices use max(512, n x c) |",
    "| more slots than graph rows | `--batch-slots` > `--cuda-graph-max-bs`: wider decode batches run as several graph replays of whole requests | as fast as graphs of every row, in less graph memory; a request with n above the largest graph decodes eagerly (`flashrec_decode_eager_forwards_total`) |",
    "| one request at a time (latency) | `--engine-process off` (on by default on CUDA) | at c=1 the pipe to an engine process costs more than the GIL it saves; under load the engine process wins, so the wide cells keep it on |",
    "| the GPU idle while the host answers | `--overlap-results` (on with CUDA) | the results' copy to the host overlaps the next step: the GPU stays busy while answers are built |",
    "| the fused q/k norm + RoPE + KV write kernel | `--qk-rope-rounding hardware` (the default) | the hardware conversion is faster than the emulated rounding and rounds where HF does |",
    "| host time of HTTP and hand-offs | `--event-loop uvloop` (asyncio by default) | uvloop measured level with asyncio on the H200 and within the noise on the CPU gate |",
    "| wide beams (n >= 512) | `--lpm-aging-ms 150`, 4,096 slots and graph rows | the deploy notes' settings (`matrices/wide_beam.yaml`) |",
]
TUNING_ZH = [
    "每个默认值为何如此。其背后的测量（除标明 CPU 外均为借用的 H200、合成 onerec-1.7b 预设）及其命令、"
    "提交、机器和日期，见 `docs/baselines.md` 的“A/B 决定”一节。",
    "",
    "| 场景 | 参数 | 原因 |",
    "| --- | --- | --- |",
    "| 一次一个请求，prompt <= 2,048 token | `--prefill-graph-max-tokens`（GPU 上默认 2048；仅在没有其他请求运行时重放） | 单个 prompt 的 eager prefill 受 launch 限制：捕获的前向让 p=1,000 的延迟减半 |",
    "| 负载下只含少数 prompt 的 prefill 批 | `--piecewise-prefill-max-tokens`（GPU 上默认 8192） | 逐层 graph 提升宽 beam 与长 prompt 的 cell；超过 8,192 token 时 padding 的代价超过 graph 的收益，更大的批保持 eager |",
    "| 大量并发请求 | `--gil-switch-interval-ms`（默认 0.2；Python 默认 5） | HTTP 与分词线程更快把 GIL 交还引擎线程：负载下 QPS 更高，c=1 时无变化 |",
    "| 同一步结束的宽回答（n >= 64） | `--respond-workers`（默认 0） | 工作进程只有在拥有自己的 CPU 核时才划算：在 H200 主机上 n=512 与 p=5,000 更快（`matrices/h200_targets.yaml` 在这两处设为 4），在 2 核机器上更慢 |",
    "| 长 prompt 突发 | `--tokenizer-workers`（默认 4） | 并行构建 prompt（Rust 编码器释放 GIL）：c=8 时分词等待更短 |",
    "| 长时间运行的服务 | `--gc-freeze`（默认开） | 预热后仍存活的对象移出回收器的各代，一次完整回收的停顿短得多；GC 停顿见 `/metrics`（`flashrec_gc_*`） |",
    "| 整个解码步作为一个 graph | `--enable-step-graph`（捕获 decode CUDA graph 时默认开；`--no-enable-step-graph` 关闭） | LM head、trie、top-n、扩展与 KV 重排随模型一起重放：每步 launch 更少，beam 相同 |",
    "| 所有请求的所有 beam 同时在飞 | `--batch-slots` = `--cuda-graph-max-bs` >= n x 并发 | H200 目标矩阵用 max(512, n x c) |",
    "| slot 多于 graph 行数 | `--batch-slots` > `--cuda-graph-max-bs`：更宽的 decode 批拆成若干次整请求的 graph replay | 与覆盖全部行数的 graph 一样快，graph 内存更少；n 超过最大 graph 的请求 eager decode（`flashrec_decode_eager_forwards_total`） |",
    "| 一次一个请求（延迟） | `--engine-process off`（CUDA 上默认开） | c=1 时到引擎进程的管道比它省下的 GIL 更贵；负载下引擎进程更优，宽 cell 保持开启 |",
    "| host 构建回答时 GPU 空闲 | `--overlap-results`（CUDA 上默认开） | 结果拷回 host 与下一步重叠：构建回答时 GPU 不空闲 |",
    "| 融合 q/k norm + RoPE + KV 写入 kernel | `--qk-rope-rounding hardware`（默认） | 硬件转换比模拟舍入快，且在 HF 舍入之处舍入 |",
    "| HTTP 与线程交接的 host 时间 | `--event-loop uvloop`（默认 asyncio） | uvloop 在 H200 上与 asyncio 持平，在 CPU gate 上处于噪声内 |",
    "| 宽 beam（n >= 512） | `--lpm-aging-ms 150`，4,096 个 slot 和 graph 行 | 部署笔记的设置（`matrices/wide_beam.yaml`） |",
]


def render(lang: str) -> str:
    en = lang == "en"
    server_only = {f.name for f in dataclasses.fields(ServerConfig)} - {
        f.name for f in dataclasses.fields(EngineConfig)
    }
    out = []
    if en:
        out += [
            "# Configuration",
            "",
            "Generated by `python scripts/gen_config_docs.py` from `flashrec/config/` (the flags are",
            "built from the same dataclass fields, so this table cannot drift from the code). Chinese:",
            "[configuration.zh-CN.md](configuration.zh-CN.md).",
            "",
            "Flags apply to `flashrec serve` (server flags too) and `flashrec generate` (engine flags).",
            "Boolean flags also have a `--no-...` form.",
            "",
        ]
        hdr = ["| flag | default | meaning |", "| --- | --- | --- |"]
    else:
        out += [
            "# 配置",
            "",
            "由 `python scripts/gen_config_docs.py` 从 `flashrec/config/` 生成（命令行参数由同一组 dataclass",
            "字段生成，文档不会与代码脱节）。English: [configuration.md](configuration.md)。",
            "",
            "参数适用于 `flashrec serve`（含服务参数）和 `flashrec generate`（引擎参数）。布尔参数另有 `--no-...` 形式。",
            "",
        ]
        hdr = ["| 参数 | 默认值 | 含义 |", "| --- | --- | --- |"]
    for title_en, title_zh, keep in (
        ("Engine", "引擎", lambda n: n not in server_only),
        ("Server", "服务", lambda n: n in server_only),
    ):
        out += [f"## {title_en if en else title_zh}", ""] + hdr
        for f in dataclasses.fields(ServerConfig):
            if keep(f.name):
                text = f.metadata.get("help", "") if en else ZH[f.name]
                choices = f.metadata.get("choices")
                if choices:
                    text += (
                        (" Choices: " if en else " 可选：")
                        + ", ".join(f"`{c}`" for c in choices)
                        + ("." if en else "")
                    )
                out.append(f"| `{_flag(f)}` | {_default(f)} | {text.replace('|', '/')} |")
        out.append("")
    unknown = {n[0] for n in NOTES} - {_flag(f) for f in dataclasses.fields(ServerConfig)}
    if unknown:
        raise SystemExit(f"NOTES name unknown flags: {sorted(unknown)}")
    out += ["## " + ("Flags in detail" if en else "参数详解"), ""]
    out += [f"- `{flag}`: {e if en else z}" for flag, e, z in NOTES] + [""]
    out += ["## " + ("`flashrec generate` only" if en else "仅 `flashrec generate`"), ""] + hdr
    for flag, e, z in GENERATE_FLAGS:
        out.append(f"| `{flag}` | - | {e if en else z} |")
    out += [
        "",
        "## " + ("`scripts/serve.sh` variables" if en else "`scripts/serve.sh` 变量"),
        "",
        "Read from `scripts/serve.env` (template `scripts/serve.env.example`) or the file named by `SERVE_ENV`; variables already in the environment win; only set variables become flags."
        if en
        else "从 `scripts/serve.env`（模板 `scripts/serve.env.example`）或 `SERVE_ENV` 指定的文件读取；环境中已有的变量优先；只有设置了的变量才转换为参数。",
        "",
        "| variable | flag |" if en else "| 变量 | 参数 |",
        "| --- | --- |",
    ]
    for var, flag in SERVE_ENV:
        out.append(f"| `{var}` | `{flag}` |")
    out += [
        "",
        "## " + ("Environment variables" if en else "环境变量"),
        "",
        "| variable | meaning |" if en else "| 变量 | 含义 |",
        "| --- | --- |",
    ]
    for var, (e, z) in ENV_VARS.items():
        out.append(f"| `{var}` | {e if en else z} |")
    out += ["", "## " + ("Precision and memory" if en else "精度与显存"), ""]
    if en:
        out += [
            "| goal | setting |",
            "| --- | --- |",
            "| default production (GPU) | `--quantization fp8` (W8A8 per channel) + `--kv-cache-dtype fp8_e4m3` |",
            "| pure BF16 | `--quantization none` (any value other than fp8) |",
            "| pre-quantized FP8 checkpoint | load it: `quantization_config` + `weight_scale` turn FP8 on (per-channel, per-tensor or block-wise scales; block-wise ones are requantized per channel on load) |",
            "| OOM | lower `--mem-fraction-static`, or `--cuda-graph-max-bs` / `--batch-slots` / `--beam-width` |",
            "",
            'A directory name containing "fp8" never turns FP8 on: only `quantization_config` or the flag do.',
        ]
    else:
        out += [
            "| 目标 | 设置 |",
            "| --- | --- |",
            "| 默认生产（GPU） | `--quantization fp8`（W8A8 per-channel）+ `--kv-cache-dtype fp8_e4m3` |",
            "| 纯 BF16 | `--quantization none`（任何非 fp8 的值） |",
            "| 预量化 FP8 checkpoint | 直接加载：`quantization_config` + `weight_scale` 启用 FP8（per-channel、per-tensor 或 block-wise scale；block-wise 的在加载时按 channel 重新量化） |",
            "| OOM | 降低 `--mem-fraction-static`，或调小 `--cuda-graph-max-bs` / `--batch-slots` / `--beam-width` |",
            "",
            '目录名带 "fp8" 不会启用 FP8：只有 `quantization_config` 或显式参数会。',
        ]
    out += ["", "## " + ("Tuning, with what was measured" if en else "调优（附实测）"), ""]
    out += TUNING_EN if en else TUNING_ZH
    return "\n".join(out) + "\n"


def main() -> int:
    check = "--check" in sys.argv
    stale = []
    for lang, name in (("en", "configuration.md"), ("zh", "configuration.zh-CN.md")):
        path = ROOT / "docs" / name
        text = render(lang)
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python scripts/gen_config_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
