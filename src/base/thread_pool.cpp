#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <memory>

namespace qspec {

namespace {
std::unique_ptr<ThreadPool>& global_pool() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
std::mutex global_pool_mutex;
size_t default_thread_count() {
  size_t hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1 : hardware;
}
}  // namespace

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) threads = default_thread_count();
  for (size_t index = 1; index < threads; ++index)
    workers_.emplace_back([this, index] { worker_loop(index); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

ThreadPool& ThreadPool::global() {
  std::lock_guard<std::mutex> lock(global_pool_mutex);
  auto& pool = global_pool();
  if (!pool) pool = std::make_unique<ThreadPool>(0);
  return *pool;
}

void ThreadPool::set_global_threads(size_t threads) {
  std::lock_guard<std::mutex> lock(global_pool_mutex);
  global_pool() = std::make_unique<ThreadPool>(threads);
}

void ThreadPool::run_chunks() {
  for (;;) {
    size_t chunk = next_chunk_.fetch_add(1);
    if (chunk >= chunk_count_) return;
    size_t begin = chunk * chunk_size_;
    size_t end = std::min(count_, begin + chunk_size_);
    try {
      (*body_)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!first_error_) first_error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop(size_t) {
  uint64_t seen_generation = 0;
  for (;;) {
    // Spin for a short while (cheap wake-up between back-to-back regions), then sleep.
    auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    while (generation_.load(std::memory_order_acquire) == seen_generation &&
           std::chrono::steady_clock::now() < spin_until) {
      std::this_thread::yield();
    }
    if (generation_.load(std::memory_order_acquire) == seen_generation) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen_generation; });
    }
    seen_generation = generation_.load(std::memory_order_acquire);
    if (stopping_.load()) return;
    run_chunks();
    pending_workers_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(size_t count, size_t grain,
                              const std::function<void(size_t, size_t)>& body) {
  if (count == 0) return;
  grain = std::max<size_t>(grain, 1);
  size_t threads = size();
  if (threads == 1 || count <= grain) {
    body(0, count);
    return;
  }
  // A few chunks per thread balances uneven work without many atomics.
  size_t chunks = std::min((count + grain - 1) / grain, threads * 4);
  body_ = &body;
  count_ = count;
  chunk_size_ = (count + chunks - 1) / chunks;
  chunk_count_ = (count + chunk_size_ - 1) / chunk_size_;
  next_chunk_.store(0);
  first_error_ = nullptr;
  pending_workers_.store(workers_.size(), std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  run_chunks();
  while (pending_workers_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  body_ = nullptr;
  if (first_error_) std::rethrow_exception(first_error_);
}

}  // namespace qspec
