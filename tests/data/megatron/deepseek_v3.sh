#!/bin/bash
# Written for MoFa's tests after the flag lists of Megatron-LM's DeepSeek-V3 examples:
# MLA, 256 routed experts + 1 shared, 3 leading dense layers, 8 router groups (top 4),
# one MTP layer; 256 GPUs: PP 4 with 16 / 15 layers on the end stages, EP 64; FP8
# blockwise; DeepEP through the flex dispatcher; selective recompute of three modules.
TRAINING_CMD="cd /opt/megatron; export PYTHONPATH=/opt/megatron:\$PYTHONPATH; python pretrain_gpt.py \
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 \
    --decoder-first-pipeline-num-layers 16 --decoder-last-pipeline-num-layers 15 \
    --expert-model-parallel-size 64 --expert-tensor-parallel-size 1 \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --use-mcore-models --sequence-parallel --use-flash-attn --disable-bias-linear \
    --micro-batch-size 1 --global-batch-size 4096 --seq-length 4096 \
    --recompute-granularity selective --recompute-modules mla_up_proj moe_act layernorm \
    --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 \
    --kv-channels 128 --max-position-embeddings 4096 --position-embedding-type rope \
    --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights \
    --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 \
    --qk-pos-emb-head-dim 64 --v-head-dim 128 \
    --num-experts 256 --moe-layer-freq ([0]*3+[1]*58) --moe-ffn-hidden-size 2048 \
    --moe-shared-expert-intermediate-size 2048 --moe-router-topk 8 \
    --moe-router-num-groups 8 --moe-router-group-topk 4 --moe-router-score-function sigmoid \
    --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep --moe-grouped-gemm \
    --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1 \
    --vocab-size 129280 --tokenizer-type HuggingFaceTokenizer --tokenizer-model deepseek-ai/DeepSeek-V3 \
    --bf16 --fp8-format e4m3 --fp8-recipe blockwise"

srun --nodes=32 --ntasks-per-node=8 bash -c "$TRAINING_CMD"
