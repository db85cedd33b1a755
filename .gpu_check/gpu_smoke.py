"""GPU check of the engine: triton decode + CUDA graphs vs eager vs Hugging Face (greedy)."""
import os, sys, time, tempfile, logging
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, transformers
sys.path.insert(0, os.getcwd())
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from mini_vllm.llm import LLM
from mini_vllm.sampling_params import SamplingParams

print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())
d = tempfile.mkdtemp()
cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2,
    tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)
torch.manual_seed(0)
transformers.LlamaForCausalLM(cfg).save_pretrained(d)
hf = transformers.AutoModelForCausalLM.from_pretrained(d).cuda().float().eval()
g = torch.Generator().manual_seed(3)
prompts = [torch.randint(0, 512, (int(n),), generator=g).tolist() for n in torch.randint(3, 60, (12,), generator=g)]
prompts += [prompts[0] + [1, 2, 3], prompts[0] + [4]]
N = 24
def hf_greedy(m, p):
    with torch.no_grad():
        o = m.generate(torch.tensor([p], device="cuda"), attention_mask=torch.ones(1, len(p), dtype=torch.long, device="cuda"), max_new_tokens=N, do_sample=False, pad_token_id=0)
    return o[0, len(p):].tolist()
refs = [hf_greedy(hf, p) for p in prompts]
sp = SamplingParams(temperature=0, max_tokens=N)
tp = [{"prompt_token_ids": p} for p in prompts]
results = {}
for name, kw in [("fp32_eager", dict(dtype="float32", enforce_eager=True)),
                 ("fp32_graphs", dict(dtype="float32")),
                 ("fp32_graphs_chunked_preempt", dict(dtype="float32", max_num_batched_tokens=32, max_num_seqs=8, max_model_len=256, kv_cache_memory_bytes=20 * 16 * 2 * 4 * 2 * 32 * 4)),
                 ("bf16_eager", dict(dtype="bfloat16", enforce_eager=True)),
                 ("bf16_graphs", dict(dtype="bfloat16", gpu_memory_utilization=0.5))]:
    t = time.time()
    llm = LLM(d, skip_tokenizer_init=True, **kw)
    r = llm.llm_engine.model_runner
    outs = llm.generate(tp, sp, use_tqdm=False)
    toks = [o.outputs[0].token_ids for o in outs]
    results[name] = toks
    same = sum(a == b for a, b in zip(toks, refs))
    print(f"{name}: {same}/{len(prompts)} == HF fp32; triton={r.use_triton} graphs={sorted(r._graphs)[:4]}..{len(r._graphs)} blocks={llm.llm_engine.num_gpu_blocks} stats={llm.get_stats()} {time.time()-t:.1f}s")
    del llm, r
    torch.cuda.empty_cache()
print("bf16 graphs == bf16 eager:", results["bf16_graphs"] == results["bf16_eager"])
