#!/bin/bash
# Written for MoFa's tests after the flag lists of Megatron-LM's examples/llama scripts:
# Llama 3 70B on 16 nodes, TP 8 x PP 4 with 5 layers per virtual stage (4 chunks), CP 2,
# FP8 with current scaling, full recompute of 2 layers per chunk. Not run.
NNODES=${SLURM_NNODES:-16}
GPUS_PER_NODE=8
TP=8; PP=4; CP=2
DTYPE=${DTYPE:-fp8}
SEQ=8192

DISTRIBUTED_ARGS="--nproc_per_node=$GPUS_PER_NODE --nnodes=$NNODES --rdzv_backend c10d"

MODEL_ARGS=(
    --use-mcore-models
    --num-layers 80
    --hidden-size 8192
    --ffn-hidden-size 28672
    --num-attention-heads 64
    --group-query-attention --num-query-groups 8
    --kv-channels 128
    --seq-length ${SEQ} --max-position-embeddings ${SEQ}
    --position-embedding-type rope --rotary-base 500000
    --swiglu --normalization RMSNorm --norm-epsilon 1e-5
    --untie-embeddings-and-output-weights --disable-bias-linear
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-70B
    --vocab-size 128256
    --attention-backend fused
)

TRAINING_ARGS=(
    --micro-batch-size 1 --global-batch-size 512
    --lr 1.5e-4 --min-lr 1.5e-5 --lr-decay-style cosine --lr-warmup-samples 1000000
    --bf16
    --recompute-granularity full --recompute-method block --recompute-num-layers 2
)
if [[ "$DTYPE" == "fp8" ]]; then
    TRAINING_ARGS+=("--fp8-format hybrid" "--fp8-recipe tensorwise" --fp8-param-gather)
elif [[ $DTYPE == mxfp8 ]]; then
    TRAINING_ARGS+=(--fp8-format e4m3 --fp8-recipe mxfp8)
fi

PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP --sequence-parallel
    --pipeline-model-parallel-size $PP --num-layers-per-virtual-pipeline-stage 5
    --context-parallel-size $CP --cp-comm-type p2p
    --tp-comm-overlap
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
)

CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun $DISTRIBUTED_ARGS \
    pretrain_gpt.py "${MODEL_ARGS[@]}" ${TRAINING_ARGS[@]} ${PARALLEL_ARGS[@]} \
    --log-interval 10 --save /checkpoints --tensorboard-dir /tb --my-cluster-flag 7
