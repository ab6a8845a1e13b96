#!/bin/bash
# Written for MoFa's tests after the flag list of Megatron-LM's examples/mixtral script:
# Mixtral 8x7B, EP 8, PP 4, 64 GPUs, Llama-2 tokenizer (32k vocabulary, not stated). Not run.
GPUS_PER_NODE=8
NNODES=8
MODEL_ARGS=(
    --use-mcore-models --disable-bias-linear
    --seq-length 4096 --max-position-embeddings 32768
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
    --init-method-std 0.01 --attention-dropout 0.0 --hidden-dropout 0.0
    --normalization RMSNorm --position-embedding-type rope --swiglu
    --untie-embeddings-and-output-weights
    --group-query-attention --num-query-groups 8
    --no-masked-softmax-fusion --no-position-embedding --rotary-base 1000000
)
MOE_ARGS=(
    --num-experts 8
    --moe-router-topk 2
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-2
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --overlap-param-gather
    --overlap-grad-reduce
)
DATA_ARGS=(--tokenizer-type Llama2Tokenizer --tokenizer-model /data/tokenizer.model --mock-data --split 99990,8,2)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 256 --lr 1e-4 --train-iters 500000 --min-lr 1.0e-5
               --weight-decay 0.1 --clip-grad 1.0 --bf16)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 4
    --expert-model-parallel-size 8
    --use-distributed-optimizer
    --sequence-parallel
)
python -m torch.distributed.run --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py \
    ${MODEL_ARGS[@]} ${MOE_ARGS[@]} ${DATA_ARGS[@]} ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]}
